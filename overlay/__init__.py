"""The tbon broker overlay: topology, protocol, rank table and the broker itself.

Nothing in this package imports typer or rich: a broker's start-up time is a product feature.
"""
