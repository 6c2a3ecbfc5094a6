"""What Python lacks, for this host: bpf(2) and libbpf, the ring buffer, network
namespaces and frames, capabilities, Landlock, cgroups, sockets handed over by systemd,
and the small processes beside the application."""
