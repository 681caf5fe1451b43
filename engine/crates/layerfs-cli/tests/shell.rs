//! Completions and man pages, generated from the command line's definition.

use std::process::Command;

const LAYERFS: &str = env!("CARGO_BIN_EXE_layerfs");

/// What bash's completion of `words` (the last one being completed) offers,
/// with the script `layerfs completions bash` prints loaded.
fn bash_completes(words: &[&str]) -> Vec<String> {
    let script = Command::new(LAYERFS)
        .args(["completions", "bash"])
        .output()
        .unwrap();
    assert!(script.status.success());
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("layerfs.bash");
    std::fs::write(&path, &script.stdout).unwrap();
    let words_list = words
        .iter()
        .map(|w| format!("'{w}'"))
        .collect::<Vec<_>>()
        .join(" ");
    let line = words.join(" ");
    let program = format!(
        "source '{}'; COMP_WORDS=({words_list}); COMP_CWORD={}; COMP_LINE='{line}'; \
         COMP_POINT=${{#COMP_LINE}}; _layerfs layerfs '{}' '{}'; printf '%s\\n' \"${{COMPREPLY[@]}}\"",
        path.display(),
        words.len() - 1,
        words[words.len() - 1],
        words[words.len() - 2],
    );
    let out = Command::new("bash")
        .args(["--norc", "-c", &program])
        .output()
        .expect("bash");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(str::to_owned)
        .collect()
}

#[test]
fn bash_completion_offers_the_verbs_and_their_options() {
    let verbs = bash_completes(&["layerfs", ""]);
    for verb in [
        "create", "mount", "commit", "diff", "reset", "pull", "push", "daemon",
    ] {
        assert!(verbs.iter().any(|v| v == verb), "{verb} not in {verbs:?}");
    }
    assert_eq!(bash_completes(&["layerfs", "cre"]), ["create"]);
    let options = bash_completes(&["layerfs", "create", "--"]);
    assert!(options.iter().any(|o| o == "--from"), "{options:?}");
}

#[test]
fn zsh_and_fish_completions_name_the_verbs() {
    for shell in ["zsh", "fish"] {
        let out = Command::new(LAYERFS)
            .args(["completions", shell])
            .output()
            .unwrap();
        assert!(out.status.success(), "{shell}");
        let script = String::from_utf8(out.stdout).unwrap();
        assert!(
            script.contains("create") && script.contains("commit"),
            "{shell}"
        );
    }
    let out = Command::new(LAYERFS)
        .args(["completions", "tcsh"])
        .output()
        .unwrap();
    assert!(!out.status.success(), "an unknown shell is refused");
}

#[test]
fn man_writes_a_page_for_each_command() {
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(LAYERFS)
        .arg("man")
        .arg(dir.path().join("man1"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let page = |name: &str| std::fs::read_to_string(dir.path().join("man1").join(name)).unwrap();
    assert!(page("layerfs.1").contains(".TH layerfs"));
    let import = page("layerfs-layer-import.1");
    assert!(import.contains("layerfs layer import"), "{import}");
    assert!(page("layerfs-create.1").contains("\\-\\-from"));
    assert!(
        !dir.path().join("man1/layerfs-keeper.1").exists(),
        "a hidden command's page"
    );
}
