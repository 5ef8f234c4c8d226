"""GPU and link health: what the check's gate judges (``judge``), what the XIDs mean
(``xid``), and the ledger that remembers sick nodes across checks and runs (``ledger``)."""
