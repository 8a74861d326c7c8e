"""Tasks, one package each (Lingvo's convention): input generator, model and layers."""
