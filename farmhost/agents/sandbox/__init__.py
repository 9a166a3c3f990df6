"""The sandbox of a run: its mounts, backends, seccomp filter, cgroups, uid, and the trees and disk it may write."""
