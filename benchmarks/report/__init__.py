"""What a sweep's result rows say: derived figures and targets, the time-to-loss and streaming
comparisons, the FSDP2 comparison, the printed tables and the PNG plots."""
