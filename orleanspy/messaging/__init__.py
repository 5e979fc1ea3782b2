"""Messages and the transports that carry them between silos and clients."""
