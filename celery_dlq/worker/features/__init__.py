"""The hook chain's features: each one module implementing the hooks of a delivery it needs."""
