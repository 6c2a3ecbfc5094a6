"""alfwrapper: per-socket eBPF firewall for socket-activated services."""

__version__ = "0.1.0"
