"""NoLoCo's pipeline: the model cut into stages (:mod:`.stages`), each micro-batch's route through the stages of
all replicas (:mod:`.routing`), one process's share of a pipelined step (:mod:`.schedule`), and the step strategy
that puts it in a replica (:mod:`.step`)."""
