//! Inbound HBONE (15008). The listener is bound on every core so the port
//! is owned and capture rules can rely on it; the mTLS HTTP/2 CONNECT
//! server that terminates tunnels here is not built yet, so connections are
//! refused with a reset (never served in plaintext) and logged.

use std::os::fd::{AsRawFd, OwnedFd};
use std::rc::Rc;

use crate::accesslog::ConnLog;
use crate::runtime::CoreInputs;
use crate::socket;

pub async fn serve(_core: Rc<CoreInputs>, conn: OwnedFd, mut log: ConnLog) {
    log.src = socket::peer_addr(conn.as_raw_fd()).ok();
    log.dst = socket::local_addr(conn.as_raw_fd()).ok();
    socket::set_reset_on_close(conn.as_raw_fd());
    log.fail("refused: the HBONE server is not available in this build");
}
