//! `layerfs system df`, `layer prune` and `image prune`: the space the
//! store takes, and giving back what nothing uses.

use std::io::{self, Write};

use layerfs_daemon::protocol::{Pruned, Request, Space, SpaceOf};

use crate::workspaces::{human, Client};

/// The store as a whole.
#[derive(clap::Subcommand)]
pub enum SystemCommand {
    /// What the layers, images and workspaces take on disk (a file of
    /// several names counted once), and what `layer prune` and `image
    /// prune` would free.
    Df,
}

impl Client {
    pub fn system(&self, command: SystemCommand) -> Result<(), String> {
        match command {
            SystemCommand::Df => {
                if let Some(space) = self.call::<Space>(Request::SystemDf)? {
                    print_space(&space);
                }
            }
        }
        Ok(())
    }

    /// Sends a prune request, and says what went.
    pub(crate) fn prune(&self, request: Request) -> Result<(), String> {
        if let Some(pruned) = self.call::<Pruned>(request)? {
            print_pruned(&pruned);
        }
        Ok(())
    }
}

fn print_space(space: &Space) {
    let mut out = io::stdout().lock();
    let _ = writeln!(
        out,
        "{:<12} {:>6} {:>9} {:>16}",
        "TYPE", "TOTAL", "SIZE", "RECLAIMABLE"
    );
    let row = |out: &mut io::StdoutLock, name: &str, s: &SpaceOf, prune: &str| {
        let reclaimable = match prune {
            "" => "-".to_owned(),
            _ => format!("{} ({})", human(s.reclaimable_bytes), s.reclaimable),
        };
        let _ = writeln!(
            out,
            "{name:<12} {:>6} {:>9} {reclaimable:>16}{prune}",
            s.count,
            human(s.bytes),
        );
    };
    row(&mut out, "layers", &space.layers, "  layerfs layer prune");
    row(&mut out, "images", &space.images, "  layerfs image prune");
    row(&mut out, "workspaces", &space.workspaces, "");
}

fn print_pruned(pruned: &Pruned) {
    for image in &pruned.images {
        println!("removed image {image}");
    }
    for layer in &pruned.layers {
        println!("removed layer {layer}");
    }
    println!(
        "{} image{}, {} layer{} removed: {} freed",
        pruned.images.len(),
        if pruned.images.len() == 1 { "" } else { "s" },
        pruned.layers.len(),
        if pruned.layers.len() == 1 { "" } else { "s" },
        human(pruned.bytes)
    );
}
