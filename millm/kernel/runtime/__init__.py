"""How work runs: jobs with progress and a bound (jobs), engine calls from a job's thread under a
lease (blocking), torch work on passing threads (threads), remote endpoints (remote), and this
process kept in step with other replicas (replication). Imports nothing else of the kernel."""
