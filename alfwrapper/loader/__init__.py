"""The loader: filters for users who may not load BPF themselves.

protocol (the wire), client (Broker), quota (who asks, what they may have),
server (the service and its command).

Since 2021 distributions set kernel.unprivileged_bpf_disabled: creating a map
or loading a program needs CAP_BPF.  Attaching a loaded program to one's own
socket needs nothing (SO_ATTACH_BPF), and since Linux 6.5 neither does using
a map or program one holds an fd of; before 6.5 the loader makes those calls
too ("fd" requests: bpf_calls.use_fd_proxy), on the fds the user sends, which
the kernel checks as it would check the user's own on 6.5.  So a small service, `alfwrapper loader`
(units alfwrapper-loader.socket and alfwrapper-loader.service), holding
CAP_BPF alone and running as the user alfwrapper-loader, compiles and loads
filters for anyone who asks over /run/alfwrapper/loader.sock, keeps the pinned
state of each user's services in a tree of that user's own (state.user_base,
under /sys/fs/bpf/alfwrapper-users; root services' tree is not in its mount
namespace), and hands back file descriptors (SCM_RIGHTS).  A wrapper or
command without CAP_BPF uses it by itself: Broker is a state.Store whose every
operation is a request here.

The protocol: a request is a 4-byte big-endian length and a JSON object, with
at most two fds (a socket, or the maps and programs of an "fd" call) beside
it; the answer is the same, with the fds it hands back.  Rules travel packed
(PrefixList.packed).  The caller is who SO_PEERCRED says; only the tree of
that uid is ever touched.  Each connection is served by a fresh child process,
bounded in time, so a hostile request can take down only itself.

Limits: requests of at most REQUEST_LIMIT bytes, read within READ_SECONDS,
served within WORK_SECONDS; per user (a person: a uid in another user's /etc/subuid
range counts as that user, person.py), at most WORKERS_PER_USER served and
PENDING_PER_USER waiting (the rest are told "busy": EX_TEMPFAIL, which the
client retries); per user, at most --max-programs live sockets and
--max-map-memory bytes of memory, counted by the kernel in a memory cgroup of
the user's own where the controller is delegated (cgroups.py), else from the
maps of live sockets; only socket filters, only the map types of the built-in
filters, only maps the request made (fresh ids); every compile confined by
Landlock to reading alfwrapper's headers and modules and the kernel headers
(confine), with the include check (program.checked_source) as a friendly
early error only.
"""
