"""The command line, a module per group of subcommands; ``main.main`` is the way in.

- ``main``: the subcommands' table, ``alfwrapper help``, and ``main``, the one place
  that turns errors into a message and an exit code.
- ``parser``: the argparse parser every subcommand's is made from.
- ``options``: the rule and socket options, and the Policy they make.
- ``wrapper``: ``alfwrapper [OPTIONS] -- COMMAND``, running a service.
- ``policy``: check, explain.
- ``service``: reload, deny, allow, revoke, show, gc (a running service changed).
- ``observe``: status, log, doctor.
- ``knock``: knock.
- ``sets``: set, crowdsec (named sets).
- ``systemd``: loader, generator (run by systemd).
"""
