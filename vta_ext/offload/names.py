"""The names the offload pass gives what it emits: the packed functions it calls and the prefixes
of the host packing / unpacking bindings (the build report counts those as layout work)."""

__all__ = ["RUN_FUNC", "RUN_PLACED_FUNC", "PACK_PREFIX", "UNPACK_PREFIX"]

RUN_FUNC = "vta_ext.run"
RUN_PLACED_FUNC = "vta_ext.run_placed"
PACK_PREFIX = "vta_pack"
UNPACK_PREFIX = "vta_unpack"
