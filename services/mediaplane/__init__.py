"""The native media plane: established sessions' RTP in C (_mediaplane.c), shared by the
transceiver (services/transceiver/nativeplane.py) and the light load clients
(services/client/pump.py); ``hooks`` hands it an aiortc session's keys and parameters and
keeps aiortc's RTCP fed."""
