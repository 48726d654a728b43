"""The adaptive sweep (``--ddtree-max-restarts``): which config to restart into next, and the model that predicts the rest.

Why a room of their own: the loop the plugin asks and the advisor's model change together and with
nothing else.
"""
