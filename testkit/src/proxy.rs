//! A TCP proxy on a fixed loopback port that can be stopped (refusing connections and closing
//! the open ones) and started again: Postgres or the object store going away under a process.

use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// Forwards `127.0.0.1:port` to a target address until stopped.
pub struct FaultProxy {
    port: u16,
    target: String,
    task: Option<JoinHandle<()>>,
}

impl FaultProxy {
    /// Starts forwarding a free loopback port to `target` (`host:port`).
    pub async fn start(target: &str) -> std::io::Result<FaultProxy> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let port = listener.local_addr()?.port();
        let task = Some(tokio::spawn(forward(listener, target.to_string())));
        Ok(FaultProxy { port, target: target.to_string(), task })
    }

    /// The loopback port clients connect to.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Refuses new connections and closes the open ones.
    pub fn stop(&mut self) {
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }

    /// Forwards again, on the same port.
    pub async fn restart(&mut self) -> std::io::Result<()> {
        let listener = TcpListener::bind(("127.0.0.1", self.port)).await?;
        self.task = Some(tokio::spawn(forward(listener, self.target.clone())));
        Ok(())
    }
}

impl Drop for FaultProxy {
    fn drop(&mut self) {
        self.stop();
    }
}

/// Accepts connections and pipes each to `target`; aborting it closes them all.
async fn forward(listener: TcpListener, target: String) {
    let mut connections = tokio::task::JoinSet::new();
    while let Ok((mut inbound, _)) = listener.accept().await {
        let target = target.clone();
        connections.spawn(async move {
            if let Ok(mut outbound) = tokio::net::TcpStream::connect(&target).await {
                let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
            }
        });
    }
}
