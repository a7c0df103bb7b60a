"""What ships with an exported drafter: the loaders' tensor layout and a standalone modeling file."""
