"""The tbon broker overlay, one room per concern, lowest layer first (docs/design.md §13 states
the rule: nothing imports a layer above its own, nor another package of its layer;
tests/test_layers.py checks it):

- `parse/`: what users type: durations, id sets, host lists, whole numbers.
- `wire/`: what both ends agree on: overlay messages, framed streams, routes and their hops,
  flow control's numbers, PMI-1 lines.
- `state/`: plain state: topology, the rank table, retirement, rank-table reports.
- `connectors/`: how commands reach a broker: the client, URIs, ssh and `tbon relay`.
- `config/`: a broker's attributes, validated once into a BrokerConfig.
- `links/`: the sockets: the parent link, the children's ROUTER and its keyring, the local socket.
- `boot/`: how a broker learns its rank: PMI, a config file, FLUB (joining), or alone.
- `services/`: what a broker answers (status, FLUB, retire, exec, ping): no I/O, actions out.
- `broker/`: the broker itself: start-up, the event loop and the router.
- `launch/`: what starts brokers: `tbon start`'s launcher and PMI server, `tbon alloc`.

Nothing in this package imports typer or rich: a broker's start-up time is a product feature.
"""
