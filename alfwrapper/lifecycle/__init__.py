"""A service's life: start-up (sockets, programs, the backlog, exec), the running
service (reload, allow, deny, gc), and the processes beside it (watcher, drop log)."""
