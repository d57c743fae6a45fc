"""The operations the model files call, each a plain formulation and a fast kernel behind one switch."""
