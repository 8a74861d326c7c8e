"""The loop emission: one tf.while_loop per device, queues between cells, what the loops carry and hand back."""
