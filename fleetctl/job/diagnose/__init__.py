"""Why a job is slow, hung or failed: the slow-node judge, folded stacks, the post-mortem (culprit
and proof), which ranks failed and a hint for their error."""
