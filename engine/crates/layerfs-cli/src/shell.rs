//! What the shell and `man` know of `layerfs`, generated from the command
//! line's own definition: completions (`layerfs completions bash|zsh|fish`)
//! and man pages (`layerfs man DIR`), so neither can fall behind it.

use std::path::{Path, PathBuf};

use clap::CommandFactory;

#[derive(clap::Args)]
pub struct CompletionsArgs {
    /// The shell to complete for.
    #[arg(value_enum)]
    shell: clap_complete::Shell,
}

#[derive(clap::Args)]
pub struct ManArgs {
    /// The directory the pages are written to (made if missing), e.g.
    /// /usr/local/share/man/man1 or ~/.local/share/man/man1
    #[arg(value_name = "DIR")]
    dir: PathBuf,
}

/// Prints the completion script of `args.shell` on stdout.
pub fn completions(args: CompletionsArgs) -> Result<(), String> {
    let mut command = crate::Cli::command();
    clap_complete::generate(args.shell, &mut command, "layerfs", &mut std::io::stdout());
    Ok(())
}

/// Writes `layerfs.1` and a page per command (`layerfs-create.1`,
/// `layerfs-layer-import.1`, ...) into `args.dir`.
pub fn man(args: ManArgs) -> Result<(), String> {
    std::fs::create_dir_all(&args.dir).map_err(|e| format!("{}: {e}", args.dir.display()))?;
    let command = crate::Cli::command();
    let written = write_pages(&command, "layerfs", &args.dir)
        .map_err(|e| format!("{}: {e}", args.dir.display()))?;
    println!("{written} man pages written in {}", args.dir.display());
    Ok(())
}

/// Writes the page of `command`, named `name`, and those of its commands.
fn write_pages(command: &clap::Command, name: &str, dir: &Path) -> std::io::Result<usize> {
    let command = command
        .clone()
        .display_name(name.to_owned())
        .bin_name(name.replace('-', " "));
    let mut page = Vec::new();
    clap_mangen::Man::new(command.clone()).render(&mut page)?;
    std::fs::write(dir.join(format!("{name}.1")), page)?;
    let mut written = 1;
    for sub in command.get_subcommands().filter(|s| !s.is_hide_set()) {
        if sub.get_name() == "help" {
            continue;
        }
        written += write_pages(sub, &format!("{name}-{}", sub.get_name()), dir)?;
    }
    Ok(written)
}
