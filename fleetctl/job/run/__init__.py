"""One run of a job and its attempts: submit, the attempt loop and its retry policy, prepare
(connect, check, push, plan), the run itself, its shared context, finish; spares, --elastic,
checkpoints, --resume, role jobs, the rendezvous port."""
