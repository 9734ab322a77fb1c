"""The transceiver's media paths, named once for the services, the scenarios and analysis:
``python`` (aiortc carries every packet: the reference) and ``native`` (the C media plane,
services/mediaplane/_mediaplane.c, carries an established session's RTP)."""
PYTHON, NATIVE = "python", "native"
MEDIA_PATHS = (PYTHON, NATIVE)
