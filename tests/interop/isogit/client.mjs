// isomorphic-git, driven by tests/interop/clients.py: one operation per run.
//
//   node client.mjs '{"op": "clone", "url": "...", "dir": "...", "depth": 1}'
//
// Prints one JSON line: {"ok": true, ...} or {"ok": false, "code": ..., "message": ...};
// the exit status is 0 either way unless the script itself breaks (then node's own 1).
import fs from 'node:fs';
import git from 'isomorphic-git';
import http from 'isomorphic-git/http/node';

function auth(args) {
  if (args.username === undefined) return {};
  return {
    onAuth: () => ({ username: args.username, password: args.password }),
    // A wrong password: isomorphic-git asks onAuth again after a 401; give up at once.
    onAuthFailure: () => ({ cancel: true }),
  };
}

async function run(args) {
  const common = { fs, http, dir: args.dir, url: args.url, ...auth(args) };
  switch (args.op) {
    case 'ls-remote': {
      const refs = await git.listServerRefs({
        http, url: args.url, protocolVersion: args.protocolVersion ?? 2,
        symrefs: true, peelTags: true, ...auth(args),
      });
      return { refs };
    }
    case 'clone':
      await git.clone({
        ...common, depth: args.depth, singleBranch: args.singleBranch ?? false,
        noCheckout: args.noCheckout ?? false,
      });
      return {};
    case 'fetch': {
      const res = await git.fetch({
        ...common, url: undefined, remote: 'origin', depth: args.depth,
        relative: args.relative ?? false, tags: args.tags ?? true,
        singleBranch: args.singleBranch ?? false,
      });
      return { fetchHead: res.fetchHead, defaultBranch: res.defaultBranch };
    }
    default:
      throw new Error(`unknown op ${args.op}`);
  }
}

const args = JSON.parse(process.argv[2]);
try {
  const out = await run(args);
  process.stdout.write(JSON.stringify({ ok: true, ...out }) + '\n');
} catch (err) {
  process.stdout.write(JSON.stringify({
    ok: false, code: err.code ?? err.name,
    // MultipleGitError (a failed index of the received pack) says what went wrong per object.
    message: [String(err.message ?? err), ...(err.errors ?? []).slice(0, 3).map(
      (e) => `${e.code ?? e.name}: ${e.message}`)].join(' | '),
  }) + '\n');
}
