"""Process groups among actors: the one rendezvous helper."""
