"""What the tests share: model builders (model_zoo), the export check against eager (export_check), the
OpInfo harness of the converter tests, the pass tests' harness and graphs, fusion expectations, memory."""
