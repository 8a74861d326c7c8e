"""Planning a pipeline: predicted memory and step time of its layouts, and the choice among them."""
