"""The tbon broker overlay, one room per concern:

- `broker/`: the broker itself: attributes, start-up, the event loop and the router.
- `boot/`: how a broker learns its rank: PMI, a config file, FLUB (joining), or alone.
- `links/`: the sockets: the parent link, the children's ROUTER and its keyring, the local socket.
- `state/`: plain state: topology, the rank table, retirement, rank-table reports.
- `services/`: what a broker answers (status, FLUB, retire, exec, ping): no I/O, actions out.
- `launch/`: what starts brokers: `tbon start`'s launcher and PMI server, `tbon alloc`.
- `connectors/`: how commands reach a broker: the client, URIs, ssh and `tbon relay`.
- `wire/`: formats on the wire: overlay messages, framed streams, PMI-1 lines.
- `parse/`: what users type: durations, id sets, host lists, whole numbers.

Nothing in this package imports typer or rich: a broker's start-up time is a product feature.
"""
