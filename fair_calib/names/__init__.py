"""The names the config is validated against (``registry``): model families, method types and
their settings, decoding policies, prior variants. Importable without torch, by the checks and by
the code that implements the names alike, so it sits below both."""
