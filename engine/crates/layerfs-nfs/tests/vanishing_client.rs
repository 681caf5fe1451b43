//! A client that vanishes in the middle of a WRITE: whatever part of the
//! call arrived is not applied (a call runs only once it is whole), nothing
//! partial is acknowledged, and other clients are served throughout.

mod support;

use std::io::Write;
use std::net::TcpStream;
use std::time::Duration;

use nfs3_types::nfs3::*;
use nfs3_types::xdr_codec::Opaque;
use support::*;

#[tokio::test]
async fn a_write_cut_off_halfway_changes_nothing_and_others_carry_on() {
    let server = TestServer::start();
    let port = server.port();
    std::fs::write(server.path("target"), b"before").unwrap();
    let mut c = mount(port).await;
    let root = c.root_nfs_fh3();
    let (target, _) = lookup(&mut c, &root, "target").await.unwrap();

    let data = vec![0xA5; 1024 * 1024];
    let frame = RawClient::frame(
        77,
        100_003,
        7,
        &WRITE3args {
            file: target.clone(),
            offset: 0,
            count: data.len() as u32,
            stable: stable_how::FILE_SYNC,
            data: Opaque::borrowed(&data),
        },
    );
    // Cut at the record mark, inside the header, inside the data, and one
    // byte short of the end.
    for cut in [2, 40, frame.len() / 2, frame.len() - 1] {
        let mut vanishing = TcpStream::connect(("127.0.0.1", port)).unwrap();
        vanishing.write_all(&frame[..cut]).unwrap();
        // Others are served while that call hangs half-sent.
        let mut other = mount(port).await;
        let (_, attr) = lookup(&mut other, &root, "target").await.unwrap();
        assert_eq!(attr.size, 6, "cut at {cut}: nothing written yet");
        drop(vanishing);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(
            std::fs::read(server.path("target")).unwrap(),
            b"before",
            "cut at {cut}: a partial WRITE was applied"
        );
    }

    // The same WRITE, whole, is applied, and the server still answers.
    let done = write(&mut c, &target, 0, &data, stable_how::FILE_SYNC).await;
    assert_eq!(done.count, data.len() as u32);
    assert_eq!(std::fs::read(server.path("target")).unwrap(), data);
}
