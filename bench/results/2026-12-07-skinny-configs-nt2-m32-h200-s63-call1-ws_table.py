# session 63 call 1 (an H200): the WS_TABLE key that the adopted TABLE entry takes over (2026-12-07-skinny-configs-nt2-m32-h200-s63-call1.md); W12_WS_TABLE
WS_TABLE = {
    (5120, 8192, 32): None,
}
