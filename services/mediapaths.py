"""The transceiver's media paths, named once for the services, the scenarios and analysis:
``python`` (aiortc carries every packet: the reference) and ``native`` (the C media plane,
services/mediaplane/_mediaplane.c, carries an established session's RTP)."""
PYTHON, NATIVE = "python", "native"
MEDIA_PATHS = (PYTHON, NATIVE)

# The native path's SRTP: its own AES-GCM on OpenSSL for the GCM profiles (libsrtp2 for the
# others; services/mediaplane/srtp_gcm.c), or libsrtp2 for every profile (the reference).
OPENSSL, LIBSRTP = "openssl", "libsrtp"
SRTP_IMPLEMENTATIONS = (OPENSSL, LIBSRTP)
