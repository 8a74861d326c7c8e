"""The framework: Params and their text form, NestedMap, BaseLayer, weights, layer metadata and the layer library."""
