"""The pure model of what a service allows: prefixes and prefix lists, inputs read with
bounds, the rules of a socket, knock sequences and policy files.  No kernel here."""
