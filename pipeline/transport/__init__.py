"""Moving hidden states from target actors to drafter actors: slot rings over shared memory."""
