"""The silo runtime: catalog, activations, dispatcher, timers, the silo host."""
