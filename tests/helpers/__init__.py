"""What tests share: where things are (support), namespaced hosts and services (hosts,
wrapping), systemd --user managers (managers), crafted packets and attacks (craft,
attacks), the boot tier's guests (guest) and the kernel tier's (cases, guest_kernel), a
brute-force oracle for rule tables (oracle).  What tests run as processes of their own
is in tests/programs."""
