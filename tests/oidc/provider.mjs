// A real OpenID Provider on loopback for gpufleet's login tests: panva's oidc-provider
// (OpenID-certified), its development login/consent pages (devInteractions), the device
// authorization grant, and two test-only endpoints:
//
//   POST /_test/rotate-keys      sign with a fresh RSA key from now on (the old one stays
//                                published), returns {"kid": ...}
//   PUT  /_test/users/<id>       replace a user's claims (e.g. their groups), JSON body
//   POST /_test/sign             sign {"claims": {...}} with the current signing key, so
//                                tests can make genuinely signed tokens with bad claims
//
// Usage: node provider.mjs PORT [CONFIG.json]
// CONFIG: {"redirect_uris": [...], "users": {"alice": {"email": ..., "groups": [...]}}}
// Only ever binds 127.0.0.1. Stops on SIGTERM/SIGINT.
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';

import * as jose from 'jose';
import Provider from 'oidc-provider';
// The keystore is built once from the `jwks` option; re-running the same initialiser is
// the one way to change the signing key of a running provider. The version is pinned in
// package.json, so this internal path is stable for us.
import initializeKeystore from 'oidc-provider/lib/helpers/initialize_keystore.js';

const port = Number(process.argv[2] || 9090);
const config = process.argv[3] ? JSON.parse(fs.readFileSync(process.argv[3], 'utf8')) : {};
const issuer = `http://127.0.0.1:${port}`;
const redirectUris = config.redirect_uris ?? ['http://127.0.0.1:8080/api/v1/auth/callback'];
const users = config.users ?? {
  alice: { email: 'alice@example.test', email_verified: true, name: 'Alice', preferred_username: 'alice', groups: ['fleet-admins'] },
};

function newSigningKey() {
  const { privateKey } = crypto.generateKeyPairSync('rsa', { modulusLength: 2048 });
  const jwk = privateKey.export({ format: 'jwk' });
  return { ...jwk, kid: `k-${crypto.randomBytes(6).toString('hex')}`, alg: 'RS256', use: 'sig' };
}

let signingKeys = [newSigningKey()];

const provider = new Provider(issuer, {
  clients: [
    {
      client_id: 'gpufleet',
      client_secret: 'gpufleet-test-secret',
      redirect_uris: redirectUris,
      grant_types: ['authorization_code'],
      response_types: ['code'],
    },
    {
      client_id: 'gpufleet-public',
      token_endpoint_auth_method: 'none',
      redirect_uris: redirectUris,
      grant_types: ['authorization_code'],
      response_types: ['code'],
    },
    {
      client_id: 'gpufleet-cli',
      token_endpoint_auth_method: 'none',
      grant_types: ['urn:ietf:params:oauth:grant-type:device_code'],
      response_types: [],
      redirect_uris: [],
    },
  ],
  jwks: { keys: signingKeys },
  claims: {
    openid: ['sub'],
    email: ['email', 'email_verified'],
    profile: ['name', 'preferred_username'],
    groups: ['groups'],
  },
  scopes: ['openid', 'email', 'profile', 'groups'],
  features: {
    devInteractions: { enabled: true },
    deviceFlow: { enabled: true },
  },
  pkce: { required: () => true },
  findAccount: (_ctx, id) => ({
    accountId: id,
    claims: () => ({ sub: id, ...(users[id] ?? {}) }),
  }),
  conformIdTokenClaims: false, // put the requested claims (groups, email) into the ID token
  ttl: { AccessToken: 3600, IdToken: 3600, DeviceCode: 600, Grant: 3600, Interaction: 600, Session: 3600 },
  cookies: { keys: ['gpufleet-test-cookie-key'] },
});

async function readJson(ctx) {
  const chunks = [];
  for await (const chunk of ctx.req) chunks.push(chunk);
  return JSON.parse(Buffer.concat(chunks).toString('utf8') || '{}');
}

provider.use(async (ctx, next) => {
  if (ctx.method === 'POST' && ctx.path === '/_test/rotate-keys') {
    signingKeys = [newSigningKey(), ...signingKeys];
    initializeKeystore.call(provider, { keys: signingKeys });
    ctx.body = { kid: signingKeys[0].kid };
    return;
  }
  if (ctx.method === 'POST' && ctx.path === '/_test/sign') {
    const { claims } = await readJson(ctx);
    const { kid, alg } = signingKeys[0];
    const key = await jose.importJWK(signingKeys[0], alg);
    ctx.body = { token: await new jose.SignJWT(claims).setProtectedHeader({ alg, kid, typ: 'JWT' }).sign(key) };
    return;
  }
  const match = /^\/_test\/users\/([\w.-]+)$/.exec(ctx.path);
  if (ctx.method === 'PUT' && match) {
    users[match[1]] = await readJson(ctx);
    ctx.body = { sub: match[1], ...users[match[1]] };
    return;
  }
  await next();
});

const server = provider.listen(port, '127.0.0.1', () => {
  console.log(`oidc-provider listening on ${issuer}`);
});
const stop = () => server.close(() => process.exit(0));
process.on('SIGTERM', stop);
process.on('SIGINT', stop);
