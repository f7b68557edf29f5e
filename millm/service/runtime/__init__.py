"""How the service runs work: jobs with progress and a bound (jobs), engine calls from a
job's thread under a lease (blocking), torch work on passing threads (threads), and this
process kept in step with other replicas (replication). Lower tier: imports no other room."""
