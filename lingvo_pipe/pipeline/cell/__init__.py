"""One cell on its device: its traced forward and backward, where its gradients go, deferred weight gradients."""
