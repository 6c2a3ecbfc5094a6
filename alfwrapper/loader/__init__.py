"""The loader: a service that compiles and loads filters for users without CAP_BPF, and
its client, a Store whose operations are requests."""
