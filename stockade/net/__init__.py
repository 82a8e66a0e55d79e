"""Network egress for `network.mode = "allowlist"`: a proxy deciding every destination.

Platform-neutral: the proxy dials from the host; each backend connects its sandbox to it (the
Linux backend hands the proxy a listener made on the sandbox's own loopback). TCP only (HTTP
CONNECT, plain HTTP, SOCKS5 CONNECT); there is no UDP. Import what you need from the modules
(`stockade.net.proxy`, `stockade.net.env`, …): this package imports nothing itself, so that
compiling a policy does not load the proxy.
"""
