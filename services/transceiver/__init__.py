"""The transceiver: ICE, DTLS and SRTP for many sessions on one UDP socket, bridged to the agent."""
