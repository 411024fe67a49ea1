//! `s3s-nodelay HOST PORT ACCESS_KEY SECRET_KEY ROOT`: s3s-fs's file-system
//! storage (SigV4 checked) behind a server whose sockets set TCP_NODELAY.

use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto::Builder;
use s3s::auth::SimpleAuth;
use s3s::service::S3ServiceBuilder;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let [host, port, access, secret, root] = args.as_slice() else {
        return Err("usage: s3s-nodelay HOST PORT ACCESS_KEY SECRET_KEY ROOT".into());
    };
    let mut b = S3ServiceBuilder::new(s3s_fs::FileSystem::new(root).map_err(|e| format!("{root}: {e:?}"))?);
    b.set_auth(SimpleAuth::from_single(access.as_str(), secret.as_str()));
    let service = b.build();
    let listener = tokio::net::TcpListener::bind((host.as_str(), port.parse::<u16>()?)).await?;
    loop {
        let (socket, _) = listener.accept().await?;
        socket.set_nodelay(true)?;
        let service = service.clone();
        tokio::spawn(async move {
            let _ = Builder::new(TokioExecutor::new())
                .serve_connection(TokioIo::new(socket), service)
                .await;
        });
    }
}
