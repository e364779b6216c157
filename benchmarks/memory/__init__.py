"""Memory per worker: the analytic model (every buffer, by front end and mode) and the programs that
measure it (resident memory on CPU, ``torch.cuda`` counters on a GPU, what gloo itself allocates)."""
