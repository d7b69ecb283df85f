"""The walk of a captured program into a GraphBuilder: the interpreter that calls one converter per FX
node, the in-place writes it replays (aliasing), the node metadata (metadata), modules carved into
ONNX local functions (functions) and torch.compile's GraphModules (graph_module)."""
