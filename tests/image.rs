//! The container image that scripts/build-image assembles with umoci, built here from the test
//! binary: a valid OCI image layout holding exactly one image (every blob is what its digest
//! says), with Docker's `manifest.json` beside it naming the same blobs, a config that runs the
//! daemon as the unprivileged user with the settings of deploy/, one layer with nothing but the
//! stripped binary, the libraries it loads with their Debian records, a CA bundle and the user
//! files (no shell), and a binary that runs from that layer alone: `--version`, and `check` on
//! the sample rules, inside a chroot of the extracted layer as user 65532, and in a container of
//! a real podman that loaded the archive with the README's commands.

#![allow(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::panic,
    clippy::indexing_slicing,
    clippy::print_stdout,
    clippy::print_stderr,
    reason = "test code: clippy.toml lets #[test] functions unwrap, index and print, and the helpers beside them do the same"
)]

#[path = "support/dist_build.rs"]
mod dist_build;

use std::collections::BTreeSet;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use dist_build::{binary, debug_sections, is_root, output, run, script};
use serde_json::Value;

const USER: &str = "65532:65532";

/// One image per test process, shared by the tests that only read it.
struct Built {
    layout: PathBuf,
    rootfs: PathBuf,
}

fn build_into(dir: &Path) -> PathBuf {
    let layout = dir.join("image");
    run(script("build-image").arg("--binary").arg(binary()).arg("--out").arg(&layout));
    layout
}

fn built() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        // A static is never dropped, so a temporary directory made here would stay in /tmp
        // after every run: one directory in cargo's scratch space instead, replaced each run.
        let dir = Path::new(env!("CARGO_TARGET_TMPDIR")).join("image-test");
        if dir.exists() {
            std::fs::remove_dir_all(&dir).unwrap_or_else(|e| panic!("remove {}: {e}", dir.display()));
        }
        std::fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("mkdir {}: {e}", dir.display()));
        let layout = build_into(&dir);
        let rootfs = dir.join("rootfs");
        std::fs::create_dir(&rootfs).expect("mkdir rootfs");
        let manifest = manifest(&layout);
        let layers = manifest["layers"].as_array().expect("layers");
        assert_eq!(layers.len(), 1, "one layer: {manifest}");
        run(Command::new("tar").arg("-xzf").arg(blob_path(&layout, &layers[0])).arg("-C").arg(&rootfs));
        Built { layout, rootfs }
    })
}

fn read_json(path: &Path) -> Value {
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{} is not JSON: {e}", path.display()))
}

fn blob_path(layout: &Path, descriptor: &Value) -> PathBuf {
    let digest = descriptor["digest"].as_str().expect("digest");
    let hex = digest.strip_prefix("sha256:").unwrap_or_else(|| panic!("not a sha256 digest: {digest}"));
    layout.join("blobs/sha256").join(hex)
}

fn sha256_of(path: &Path) -> String {
    let printed = run(Command::new("sha256sum").arg(path));
    format!("sha256:{}", printed.split_whitespace().next().expect("a digest"))
}

/// The entry of index.json tagged with the version: the descriptor of the image's manifest.
fn index_entry(layout: &Path) -> Value {
    let index = read_json(&layout.join("index.json"));
    let entries = index["manifests"].as_array().expect("manifests");
    let tagged = entries.iter().find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag());
    tagged.unwrap_or_else(|| panic!("no {} in index.json: {index}", tag())).clone()
}

/// The image's manifest.
fn manifest(layout: &Path) -> Value {
    read_json(&blob_path(layout, &index_entry(layout)))
}

/// The image's one tag: the version.
fn tag() -> &'static str {
    env!("CARGO_PKG_VERSION")
}

/// The image's full name: what the Deployment's `watermarkd:VERSION` means to a node.
fn full_name() -> String {
    format!("docker.io/library/watermarkd:{}", tag())
}

fn config(layout: &Path) -> Value {
    read_json(&blob_path(layout, &manifest(layout)["config"]))
}

/// Every file of the extracted layer, relative to its root ("usr/bin/watermarkd").
fn files(root: &Path) -> Vec<(String, std::fs::Metadata)> {
    let mut found = Vec::new();
    let mut pending = vec![root.to_path_buf()];
    while let Some(dir) = pending.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let entry = entry.expect("entry");
            let meta = std::fs::symlink_metadata(entry.path()).expect("metadata");
            if meta.is_dir() {
                pending.push(entry.path());
            }
            let relative = entry.path().strip_prefix(root).expect("inside").to_string_lossy().into_owned();
            found.push((relative, meta));
        }
    }
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

/// Runs the image's binary from the extracted layer alone: chroot into it as the image's user
/// (as root), or as the mapped root of a user namespace otherwise.
fn in_image(root: &Path, args: &[&str]) -> std::process::Output {
    // By absolute path: the child's environment is cleared, PATH included.
    let tool = |name: &str| {
        ["/usr/sbin", "/usr/bin", "/sbin", "/bin"]
            .iter()
            .map(|dir| Path::new(dir).join(name))
            .find(|p| p.is_file())
            .unwrap_or_else(|| panic!("{name} not found (Debian's coreutils / util-linux)"))
    };
    let mut command = if is_root() {
        let mut c = Command::new(tool("chroot"));
        c.arg(format!("--userspec={USER}")).arg(root);
        c
    } else {
        let mut c = Command::new(tool("unshare"));
        c.arg("--map-root-user").arg(tool("chroot")).arg(root);
        c
    };
    command.arg("/usr/bin/watermarkd").args(args).env_clear().env("PATH", "/usr/bin");
    output(&mut command)
}

#[test]
fn every_blob_of_the_layout_is_what_its_digest_and_size_say() {
    let layout = &built().layout;
    let layout_file = read_json(&layout.join("oci-layout"));
    assert_eq!(layout_file["imageLayoutVersion"], "1.0.0");
    // One image (a second entry, such as a `latest` tag, makes `podman load` and `skopeo copy`
    // refuse the archive), tagged with the version and named in full.
    let index = read_json(&layout.join("index.json"));
    assert_eq!(index["manifests"].as_array().map(Vec::len), Some(1), "one image in index.json: {index}");
    let entry = index_entry(layout);
    assert_eq!(entry["mediaType"], "application/vnd.oci.image.manifest.v1+json");
    assert_eq!(entry["annotations"]["org.opencontainers.image.ref.name"], tag());
    assert_eq!(entry["annotations"]["io.containerd.image.name"], full_name().as_str());
    assert_eq!(Some(sha256_of(&blob_path(layout, &entry)).as_str()), entry["digest"].as_str(), "the manifest blob");

    let manifest = manifest(layout);
    assert_eq!(manifest["config"]["mediaType"], "application/vnd.oci.image.config.v1+json");
    let mut descriptors = vec![manifest["config"].clone()];
    descriptors.extend(manifest["layers"].as_array().expect("layers").iter().cloned());
    for descriptor in &descriptors {
        let path = blob_path(layout, descriptor);
        assert_eq!(sha256_of(&path), descriptor["digest"].as_str().expect("digest"), "{}", path.display());
        let size = std::fs::metadata(&path).expect("blob").len();
        assert_eq!(Some(size), descriptor["size"].as_u64(), "size of {}", path.display());
    }
    let layer = &manifest["layers"][0];
    assert_eq!(layer["mediaType"], "application/vnd.oci.image.layer.v1.tar+gzip");

    // The config names the layer by the digest of its uncompressed tar.
    let unpacked = tempfile::NamedTempFile::new().expect("temp file");
    run(Command::new("sh")
        .arg("-c")
        .arg("gzip -dc \"$0\" > \"$1\"")
        .arg(blob_path(layout, layer))
        .arg(unpacked.path()));
    let config = config(layout);
    assert_eq!(config["rootfs"]["type"], "layers");
    assert_eq!(config["rootfs"]["diff_ids"], serde_json::json!([sha256_of(unpacked.path())]));

    // Docker's classic image store reads manifest.json alone: the same config and layer, under
    // the short name the Deployment runs.
    let docker = read_json(&layout.join("manifest.json"));
    let blob_name = |descriptor: &Value| {
        format!("blobs/sha256/{}", descriptor["digest"].as_str().expect("digest").trim_start_matches("sha256:"))
    };
    let expected = serde_json::json!([{
        "Config": blob_name(&manifest["config"]),
        "RepoTags": [format!("watermarkd:{}", tag())],
        "Layers": [blob_name(layer)],
    }]);
    assert_eq!(docker, expected, "manifest.json");

    // The layout with the extra file is still one umoci reads, with the one tag.
    let tags = run(Command::new("umoci").arg("ls").arg("--layout").arg(layout));
    assert_eq!(tags.lines().collect::<Vec<_>>(), [tag()], "umoci ls");

    // The single-file form beside the layout holds the same files.
    let archive = layout.with_extension("tar");
    let listed = run(Command::new("tar").arg("-tf").arg(&archive));
    for entry in ["./oci-layout", "./index.json", "./manifest.json"] {
        assert!(listed.lines().any(|l| l == entry), "{} lacks {entry}:\n{listed}", archive.display());
    }
}

#[test]
fn the_config_runs_the_daemon_unprivileged_with_the_settings_and_the_metrics_port() {
    let config = config(&built().layout);
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], run(Command::new("dpkg").arg("--print-architecture")).trim());
    let runtime = &config["config"];
    assert_eq!(runtime["User"], USER, "not root");
    assert_eq!(runtime["Entrypoint"], serde_json::json!(["/usr/bin/watermarkd"]));
    assert_eq!(runtime["Cmd"], serde_json::json!(["run", "--settings", "/etc/watermarkd/watermarkd.toml"]));
    let ports: Vec<&String> = runtime["ExposedPorts"].as_object().expect("ports").keys().collect();
    assert_eq!(ports, ["8080/tcp"], "the port of /metrics, /healthz and /readyz (deploy/)");
    let labels = &runtime["Labels"];
    assert_eq!(labels["org.opencontainers.image.version"], env!("CARGO_PKG_VERSION"));
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert_eq!(labels["org.opencontainers.image.title"], "watermarkd");

    // What the manifests (rendered from the chart) expect of the image.
    let manifest = std::fs::read_to_string(dist_build::repo().join("deploy/deployment.yaml")).expect("deployment");
    let deployment: k8s_openapi::api::apps::v1::Deployment = serde_yaml_ng::from_str(&manifest).expect("a Deployment");
    let pod = deployment.spec.expect("spec").template.spec.expect("pod spec");
    let container = &pod.containers[0];
    let run_as = pod.security_context.as_ref().and_then(|c| c.run_as_user).expect("runAsUser");
    assert_eq!(runtime["User"], format!("{run_as}:{run_as}"), "the pod's runAsUser is the image's user");
    let port = container.ports.as_ref().and_then(|p| p.first()).map(|p| p.container_port).expect("a port");
    assert_eq!(ports, [&format!("{port}/tcp")], "the container port is the image's");
    let args = container.args.clone().expect("args");
    assert_eq!(runtime["Cmd"], serde_json::json!(args), "the Deployment's args are the image's default command");
    // The fixed SOURCE_DATE_EPOCH of the tests, 2023-11-14T22:13:20Z: no build time leaks in.
    assert_eq!(config["created"], "2023-11-14T22:13:20Z");
}

#[test]
fn the_layer_holds_the_stripped_binary_its_libraries_and_no_shell() {
    let root = &built().rootfs;
    let all = files(root);
    let names: BTreeSet<&str> = all.iter().map(|(n, _)| n.as_str()).collect();

    assert!(!debug_sections(&binary()).is_empty(), "the test binary has debug sections to strip");
    let shipped = root.join("usr/bin/watermarkd");
    assert_eq!(debug_sections(&shipped), Vec::<String>::new(), "the image's binary is stripped");

    // Executables: the binary and the shared objects it loads, nothing else (no shell, no
    // busybox, no package manager).
    let executables: Vec<&str> = all
        .iter()
        .filter(|(_, m)| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .map(|(n, _)| n.as_str())
        .collect();
    for name in &executables {
        let file = Path::new(name).file_name().and_then(|f| f.to_str()).unwrap_or_default();
        assert!(
            *name == "usr/bin/watermarkd" || (name.starts_with("usr/lib/") && file.contains(".so")),
            "unexpected executable in the image: {name}"
        );
    }
    for shell in ["sh", "bash", "dash", "ash", "busybox"] {
        for dir in ["bin", "usr/bin", "sbin", "usr/sbin"] {
            assert!(!root.join(dir).join(shell).exists(), "{dir}/{shell} in the image");
        }
    }
    // Each library by the path the loader finds it at on this machine (through the image's
    // /lib and /lib64 links), and the loader itself.
    let ldd = run(Command::new("ldd").arg(&shipped));
    let loaded: Vec<&str> = ldd
        .lines()
        .filter_map(|l| match l.split_once("=>") {
            Some((_, resolved)) => resolved.split_whitespace().next(),
            None => l.split_whitespace().next().filter(|p| p.starts_with('/')),
        })
        .collect();
    assert!(loaded.len() >= 3, "ldd named the loader and libc at least: {ldd}");
    for library in loaded {
        assert!(
            root.join(library.trim_start_matches('/')).is_file(),
            "the binary loads {library}, which the image lacks"
        );
    }

    // Every file belongs to root; only /tmp is writable by others.
    for (name, meta) in &all {
        assert_eq!((meta.uid(), meta.gid()), (0, 0), "owner of {name}");
        if name != "tmp" && !meta.file_type().is_symlink() {
            assert_eq!(meta.permissions().mode() & 0o022, 0, "{name} is writable by others");
        }
    }
    assert_eq!(std::fs::metadata(root.join("tmp")).expect("tmp").permissions().mode() & 0o7777, 0o1777);

    // The user of the config exists, without a login shell.
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).expect("etc/passwd");
    let user = passwd.lines().find(|l| l.split(':').nth(2) == Some("65532")).expect("user 65532 in /etc/passwd");
    assert!(user.ends_with(":/sbin/nologin"), "{user}");

    // Where the libraries come from, for scanners and for their licences.
    for package in ["libc6", "libgcc-s1", "ca-certificates"] {
        let status = std::fs::read_to_string(root.join("var/lib/dpkg/status.d").join(package))
            .unwrap_or_else(|e| panic!("no dpkg record of {package}: {e}"));
        assert!(status.starts_with(&format!("Package: {package}\n")), "{status}");
        assert!(status.contains("\nVersion: "), "{status}");
        assert!(names.contains(format!("usr/share/doc/{package}/copyright").as_str()), "{package} copyright");
    }
    let bundle = std::fs::read_to_string(root.join("etc/ssl/certs/ca-certificates.crt")).expect("CA bundle");
    assert!(bundle.matches("-----BEGIN CERTIFICATE-----").count() > 50, "a CA bundle to verify backends with");
}

#[test]
fn the_binary_runs_from_the_image_alone_and_checks_the_sample_rules() {
    let root = &built().rootfs;
    let printed = in_image(root, &["--version"]);
    assert!(printed.status.success(), "--version in the image: {printed:?}");
    assert_eq!(String::from_utf8_lossy(&printed.stdout).trim(), format!("watermarkd {}", env!("CARGO_PKG_VERSION")));

    // The sample rules go where the user can read them: /tmp, the one writable directory.
    let scratch = tempfile::tempdir_in(root.join("tmp")).expect("scratch dir in the image");
    std::fs::set_permissions(scratch.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let rules = scratch.path().join("rules.toml");
    std::fs::copy(dist_build::repo().join("packaging/etc/watermarkd/rules.toml"), &rules).expect("copy the rules");
    std::fs::set_permissions(&rules, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let inside = Path::new("/").join(rules.strip_prefix(root).expect("inside"));
    let inside = inside.to_str().expect("utf-8");
    let checked = in_image(root, &["check", "--rules", inside]);
    let stdout = String::from_utf8_lossy(&checked.stdout);
    assert!(checked.status.success(), "check in the image: {checked:?}");
    assert!(stdout.contains(": ok, 1 autoscaler"), "{stdout}");

    // And it fails there as it does anywhere: a broken file is an error naming the field.
    std::fs::write(&rules, "[[autoscaler]]\nname = \"x\"\nmin_replicas = \"two\"\n").expect("write");
    let refused = in_image(root, &["check", "--rules", inside]);
    assert!(!refused.status.success(), "a broken rules file passes check in the image");
    let said = dist_build::printed(&refused);
    assert!(said.contains("min_replicas"), "{said}");
}

#[test]
fn the_same_binary_and_date_give_the_same_image_digest() {
    let dir = tempfile::tempdir().expect("temp dir");
    let again = build_into(dir.path());
    let first = std::fs::read_to_string(built().layout.join("index.json")).expect("index");
    let second = std::fs::read_to_string(again.join("index.json")).expect("index");
    assert_eq!(first, second, "two builds of one binary differ: the image is not reproducible");
    let archive = |layout: &Path| sha256_of(&layout.with_extension("tar"));
    assert_eq!(archive(&built().layout), archive(&again), "the two archives differ");
}

/// A podman of this test's own: its configuration, storage and state in a temporary directory,
/// so that nothing on the machine (an /etc/containers, images loaded before) changes what it
/// does, and what it stores goes with the test. (The one thing outside: as root, the image
/// library keeps its cache of which blob digests it has seen in /var/lib/containers/cache,
/// which no option moves and which changes nothing a load or a run does.)
struct Podman {
    home: tempfile::TempDir,
}

impl Podman {
    fn new() -> Self {
        for program in ["podman", "runc", "skopeo"] {
            if let Err(e) = Command::new(program).arg("--version").output() {
                panic!("{program}: {e} (scripts/install-test-deps installs podman, runc and skopeo)");
            }
        }
        let home = tempfile::tempdir().expect("temp dir");
        let at = |name: &str| home.path().join(name).to_str().expect("utf-8 temp path").to_string();
        // runc with cgroupfs: on these machines crun refuses the cgroup setup; no default
        // ulimits, which the container manager may not be allowed to raise here. Its state and
        // events in the temporary directory too, and no network configuration written anywhere.
        let containers = format!(
            "[containers]\ndefault_ulimits = []\n\n\
             [engine]\nruntime = \"runc\"\ncgroup_manager = \"cgroupfs\"\nevents_logger = \"file\"\n\
             events_logfile_path = \"{}\"\ntmp_dir = \"{}\"\n\n\
             [network]\nnetwork_config_dir = \"{}\"\n",
            at("events.log"),
            at("tmp"),
            at("networks"),
        );
        // vfs: plain directories, no overlay mounts left behind if a test fails half-way.
        let storage =
            format!("[storage]\ndriver = \"vfs\"\ngraphroot = \"{}\"\nrunroot = \"{}\"\n", at("graph"), at("run"));
        // No registries to expand a short name with (nothing is pulled), and a policy that
        // accepts what is loaded from a local file.
        let files = [
            ("containers.conf", containers),
            ("storage.conf", storage),
            ("registries.conf", "unqualified-search-registries = []\n".to_string()),
            (".config/containers/policy.json", r#"{"default": [{"type": "insecureAcceptAnything"}]}"#.to_string()),
        ];
        for (name, text) in files {
            let path = home.path().join(name);
            std::fs::create_dir_all(path.parent().expect("a parent")).expect("mkdir");
            std::fs::write(&path, text).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
        }
        Podman { home }
    }

    /// podman or skopeo (which reads the same files), with this configuration and no other.
    fn tool(&self, program: &str) -> Command {
        let home = self.home.path();
        let mut command = Command::new(program);
        command
            .env("HOME", home)
            .env("CONTAINERS_CONF", home.join("containers.conf"))
            .env("CONTAINERS_STORAGE_CONF", home.join("storage.conf"))
            .env("CONTAINERS_REGISTRIES_CONF", home.join("registries.conf"));
        command
    }

    fn podman(&self) -> Command {
        self.tool("podman")
    }

    /// `podman run --rm IMAGE ARGS...` as the README writes it, never pulling (the image must be
    /// the loaded one) and with no network (tests reach nothing beyond the machine).
    fn run_image(&self, image: &str, mounts: &[(&Path, &str)], args: &[&str]) -> std::process::Output {
        let mut command = self.podman();
        command.args(["run", "--rm", "--pull", "never", "--network", "none"]);
        for (host, inside) in mounts {
            command.arg("--volume").arg(format!("{}:{inside}:ro", host.display()));
        }
        command.arg(image).args(args);
        output(&mut command)
    }
}

impl Drop for Podman {
    fn drop(&mut self) {
        // Removes the images and any container a failed test left, with the same configuration;
        // the temporary directory goes after.
        let reset = output(self.podman().args(["system", "reset", "--force"]));
        if !reset.status.success() {
            eprintln!("podman system reset: {}", dist_build::printed(&reset));
        }
    }
}

/// podman needs root here: a rootless one needs subordinate user ids for the image's user.
fn podman_can_run(test: &str) -> bool {
    dist_build::root_or_skip(test, "and a rootless podman needs subordinate ids for user 65532")
}

#[test]
fn podman_loads_the_archive_as_one_image_and_runs_the_daemon_in_a_container() {
    if !podman_can_run("podman_loads_the_archive_as_one_image_and_runs_the_daemon_in_a_container") {
        return;
    }
    let archive = built().layout.with_extension("tar");
    let podman = Podman::new();

    // The README's command, as written: no tag to choose.
    let loaded = run(podman.podman().arg("load").arg("-i").arg(&archive));
    assert!(loaded.contains(&full_name()), "podman load named no {}: {loaded}", full_name());
    let listed = run(podman.podman().args(["images", "--format", "{{.Repository}}:{{.Tag}}"]));
    assert_eq!(listed.lines().collect::<Vec<_>>(), [full_name()], "the images podman holds");
    let user = run(podman.podman().args(["image", "inspect", "--format", "{{.Config.User}}", &full_name()]));
    assert_eq!(user.trim(), USER);

    // By the short name the Deployment and the README use.
    let short = format!("watermarkd:{}", tag());
    let version = podman.run_image(&short, &[], &["--version"]);
    assert!(version.status.success(), "--version in a container: {}", dist_build::printed(&version));
    assert_eq!(String::from_utf8_lossy(&version.stdout).trim(), format!("watermarkd {}", tag()));

    // The sample rules, mounted read-only where the Deployment mounts its ConfigMap.
    let rules_dir = tempfile::tempdir().expect("temp dir");
    std::fs::set_permissions(rules_dir.path(), std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let rules = rules_dir.path().join("rules.toml");
    std::fs::copy(dist_build::repo().join("packaging/etc/watermarkd/rules.toml"), &rules).expect("copy the rules");
    std::fs::set_permissions(&rules, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let mounts = [(rules_dir.path(), "/etc/watermarkd")];
    let check = ["check", "--rules", "/etc/watermarkd/rules.toml"];
    let checked = podman.run_image(&short, &mounts, &check);
    assert!(checked.status.success(), "check in a container: {}", dist_build::printed(&checked));
    assert!(String::from_utf8_lossy(&checked.stdout).contains(": ok, 1 autoscaler"), "{checked:?}");

    // As user 65532, not root: a file only root may read is refused.
    std::fs::set_permissions(&rules, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let unreadable = podman.run_image(&short, &mounts, &check);
    assert!(!unreadable.status.success(), "the container read a root-only file: it runs as root");
    let said = dist_build::printed(&unreadable);
    assert!(said.contains("rules.toml") && said.to_lowercase().contains("permission denied"), "{said}");

    // And a broken file fails there as anywhere, naming the field.
    std::fs::write(&rules, "[[autoscaler]]\nname = \"x\"\nmin_replicas = \"two\"\n").expect("write");
    std::fs::set_permissions(&rules, std::fs::Permissions::from_mode(0o644)).expect("chmod");
    let refused = podman.run_image(&short, &mounts, &check);
    assert!(!refused.status.success(), "a broken rules file passes check in a container");
    let said = dist_build::printed(&refused);
    assert!(said.contains("min_replicas"), "{said}");
}

#[test]
fn skopeo_copies_the_archive_and_its_docker_manifest_loads_the_same_image() {
    if !podman_can_run("skopeo_copies_the_archive_and_its_docker_manifest_loads_the_same_image") {
        return;
    }
    let layout = &built().layout;
    let archive = layout.with_extension("tar");
    let podman = Podman::new();

    // The README's `skopeo copy oci-archive:target/dist/image.tar ...`, into a directory here
    // instead of a registry: the same image, manifest digest unchanged.
    let copied = podman.home.path().join("copied");
    run(podman.tool("skopeo").arg("copy").arg(format!("oci-archive:{}", archive.display())).arg(format!(
        "oci:{}:{}",
        copied.display(),
        tag()
    )));
    assert_eq!(index_entry(&copied)["digest"], index_entry(layout)["digest"], "skopeo's copy is another image");

    // What `docker load` reads in Docker's classic store, manifest.json, read by the library
    // podman uses for Docker's archives (which checks each layer against the config's diff_ids):
    // the same image, by its config digest (the image id), under the name in RepoTags (which
    // podman qualifies with `localhost/`, Docker with `docker.io/library/`).
    let loaded = run(podman.podman().arg("pull").arg(format!("docker-archive:{}", archive.display())));
    let id = loaded.lines().last().unwrap_or_default().trim().to_string();
    let config_digest = manifest(layout)["config"]["digest"].as_str().expect("config digest").to_string();
    assert_eq!(format!("sha256:{id}"), config_digest, "podman pull docker-archive: {loaded}");
    let names = run(podman.podman().args(["image", "inspect", "--format", "{{.RepoTags}}", &id]));
    assert!(names.contains(&format!("/watermarkd:{}", tag())), "the image from manifest.json: {names}");
}
