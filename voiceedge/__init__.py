"""voiceedge: a testbed for a global, geo-steered WebRTC edge for voice AI."""
__version__ = "0.1.0"
