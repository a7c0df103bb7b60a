"""The process runtime: Ray start-up and kept actors, stop signals, garbage collection at
start-up, wandb's environment, and the lines for disk-full and chained errors."""
