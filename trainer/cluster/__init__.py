"""The trainer on several machines: the cluster's config, the client that connects to it, worker processes and their watchdog, and what a worker exposes on the network."""
