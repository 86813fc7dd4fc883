//! The seccomp profile of a container that runs Verity's sandbox — a worker's, and the API
//! server's (it grades `code` and `python` graders itself for `graders/run` and the trial run of
//! `graders/validate`) — so that the container no longer needs `seccomp: Unconfined`.
//!
//! bubblewrap builds each sandbox inside that container: it clones into new namespaces, mounts
//! the sandbox's file-system view and pivots into it. A runtime's default profile refuses those
//! calls to a container without `CAP_SYS_ADMIN`, which is why workers used to run unconfined.
//! This profile is the sandbox's own deny list ([`DENIED`]) minus the calls bubblewrap makes
//! while it builds a sandbox ([`BWRAP_BUILDS_WITH`]): the `verity` process and everything it
//! starts outside a sandbox (bwrap included) cannot trace other processes, use the kernel
//! keyring, `bpf`, `perf_event_open`, `userfaultfd` or io_uring, load modules, open files by
//! handle, join other namespaces or administer the host — none of which Verity needs — and the
//! sandboxed programs stay under the full filter, which stacks on top.
//!
//! The profile is written in the JSON format Docker, Podman, containerd and CRI-O read
//! (`docker run --security-opt seccomp=FILE`, compose `security_opt`, Kubernetes
//! `seccompProfile: {type: Localhost}`). `deploy/seccomp/verity-sandbox.json` is [`profile`] as
//! `verity graders seccomp-profile` prints it; a test keeps the two equal, and
//! `cli/tests/worker_image.rs` and `cli/tests/cluster.rs` run the images' sandbox under it.

use std::collections::BTreeMap;

use serde::Serialize;

use super::seccomp::DENIED;

/// The calls of [`DENIED`] that bubblewrap itself makes while it builds a sandbox, each with
/// what bwrap uses it for; the container must allow them.
pub const BWRAP_BUILDS_WITH: &[(&str, &str)] = &[
    ("clone", "starts the sandbox's first process in new namespaces (CLONE_NEW* flags)"),
    ("unshare", "the nested user namespace of --disable-userns"),
    ("mount", "the sandbox's file-system view: binds, tmpfs, a new /proc"),
    ("umount2", "detaches the old root after the pivot"),
    ("pivot_root", "switches into the sandbox's root"),
];

/// The architectures the profile names: with them, 32-bit and x32 system calls on x86_64 (and
/// 32-bit ARM calls on aarch64) are refused by name like the native ones.
const ARCHITECTURES: &[&str] =
    &["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32", "SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"];

/// A seccomp profile in the format container runtimes read; its fields serialise in this
/// order whatever serde_json's features, so the committed file is byte-stable.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    /// What a call no rule names gets: allowed.
    pub default_action: &'static str,
    /// The architectures the rules apply to.
    pub architectures: &'static [&'static str],
    /// One rule per errno.
    pub syscalls: Vec<Rule>,
}

/// Calls refused with one errno.
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    /// The system calls' names.
    pub names: Vec<&'static str>,
    /// Always `SCMP_ACT_ERRNO`.
    pub action: &'static str,
    /// The errno they fail with.
    pub errno_ret: i32,
}

/// The sandboxing container's seccomp profile: every call allowed but those of [`DENIED`] that
/// bubblewrap does not need, each refused with the errno the sandbox's filter uses for it.
pub fn profile() -> Profile {
    let needed = |name: &str| BWRAP_BUILDS_WITH.iter().any(|(call, _)| *call == name);
    let mut by_errno: BTreeMap<i32, Vec<&'static str>> = BTreeMap::new();
    for call in DENIED.iter().filter(|call| !needed(call.name)) {
        by_errno.entry(call.errno).or_default().push(call.name);
    }
    let syscalls = by_errno
        .into_iter()
        .map(|(errno_ret, names)| Rule { names, action: "SCMP_ACT_ERRNO", errno_ret })
        .collect();
    Profile { default_action: "SCMP_ACT_ALLOW", architectures: ARCHITECTURES, syscalls }
}

/// [`profile`] as the committed file holds it: pretty JSON and a final newline.
pub fn profile_text() -> String {
    let mut text =
        serde_json::to_string_pretty(&profile()).expect("a profile of strings always serialises");
    text.push('\n');
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_call_bwrap_needs_is_one_the_sandbox_denies() {
        for (name, why) in BWRAP_BUILDS_WITH {
            assert!(DENIED.iter().any(|c| c.name == *name), "{name} is not in DENIED");
            assert!(!why.is_empty());
        }
    }

    #[test]
    fn the_profile_refuses_the_rest_of_the_deny_list_and_allows_what_bwrap_needs() {
        let profile = profile();
        let refused: Vec<&str> =
            profile.syscalls.iter().flat_map(|rule| rule.names.iter().copied()).collect();
        for name in ["ptrace", "keyctl", "bpf", "perf_event_open", "setns", "clone3", "init_module"]
        {
            assert!(refused.contains(&name), "{name} must be refused");
        }
        for (name, _) in BWRAP_BUILDS_WITH {
            assert!(!refused.contains(name), "{name} must stay allowed for bwrap");
        }
        assert_eq!(refused.len(), DENIED.len() - BWRAP_BUILDS_WITH.len());
        assert_eq!(profile.default_action, "SCMP_ACT_ALLOW");
    }

    #[test]
    fn the_committed_profile_is_the_generated_one() {
        let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../deploy/seccomp/verity-sandbox.json");
        if std::env::var_os("VERITY_BLESS").is_some() {
            std::fs::write(path, profile_text()).expect("writing the profile");
        }
        let committed = std::fs::read_to_string(path).expect("deploy/seccomp/verity-sandbox.json");
        assert_eq!(
            committed,
            profile_text(),
            "deploy/seccomp/verity-sandbox.json is stale: regenerate it with \
             `verity graders seccomp-profile > deploy/seccomp/verity-sandbox.json` (or run this \
             test with VERITY_BLESS=1)"
        );
    }
}
