/**
 * Test certificates made with openssl: a CA, a server certificate for 127.0.0.1/localhost and client
 * certificates whose keys are in PKCS#8, SEC1 (EC) and PKCS#1 (RSA) form ({@linkcode makeTestPki}); and
 * the building blocks for other throwaway PKIs ({@linkcode makeCA}, {@linkcode issueCert}).
 * @module
 */

/** PEM files of a throwaway PKI, and their paths in `dir`. */
export interface TestPki {
  dir: string;
  caCert: string;
  caKey: string;
  serverCert: string;
  serverKey: string;
  /** Client certificate CN=system:kube-proxy, O=system:node-proxier (EC P-256), key in PKCS#8. */
  clientCert: string;
  clientKeyPkcs8: string;
  /** The same EC key in SEC1 form (`BEGIN EC PRIVATE KEY`). */
  clientKeySec1: string;
  /** A second client certificate with an RSA key in PKCS#1 form (`BEGIN RSA PRIVATE KEY`). */
  rsaClientCert: string;
  rsaClientKeyPkcs1: string;
  /** Paths of the files above, by the same names. */
  paths: Record<
    | "caCert"
    | "serverCert"
    | "serverKey"
    | "clientCert"
    | "clientKeyPkcs8"
    | "clientKeySec1"
    | "rsaClientCert"
    | "rsaClientKeyPkcs1",
    string
  >;
}

async function openssl(dir: string, args: string[]): Promise<void> {
  const out = await new Deno.Command("openssl", { args, cwd: dir, stdout: "null", stderr: "piped" }).output();
  if (!out.success) {
    throw new Error(`openssl ${args.join(" ")} failed: ${new TextDecoder().decode(out.stderr)}`);
  }
}

/** Creates a CA, a server certificate and client certificates (all key formats) in a new temp dir. */
export async function makeTestPki(): Promise<TestPki> {
  const dir = await Deno.makeTempDir({ prefix: "kube-pki-" });
  const ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];
  await openssl(dir, [
    "req",
    "-x509",
    ...ec,
    "-nodes",
    "-keyout",
    "ca.key",
    "-out",
    "ca.crt",
    "-days",
    "2",
    "-subj",
    "/CN=test-ca",
  ]);
  await Deno.writeTextFile(
    `${dir}/server.ext`,
    "subjectAltName=IP:127.0.0.1,DNS:localhost,DNS:kubernetes.default.svc\nextendedKeyUsage=serverAuth\n",
  );
  await openssl(dir, [
    "req",
    ...ec,
    "-nodes",
    "-keyout",
    "server.key",
    "-out",
    "server.csr",
    "-subj",
    "/CN=kube-apiserver",
  ]);
  await openssl(dir, [
    "x509",
    "-req",
    "-in",
    "server.csr",
    "-CA",
    "ca.crt",
    "-CAkey",
    "ca.key",
    "-CAcreateserial",
    "-out",
    "server.crt",
    "-days",
    "2",
    "-extfile",
    "server.ext",
  ]);
  await Deno.writeTextFile(`${dir}/client.ext`, "extendedKeyUsage=clientAuth\n");
  await openssl(dir, [
    "req",
    ...ec,
    "-nodes",
    "-keyout",
    "client.pkcs8.key",
    "-out",
    "client.csr",
    "-subj",
    "/O=system:node-proxier/CN=system:kube-proxy",
  ]);
  await openssl(dir, [
    "x509",
    "-req",
    "-in",
    "client.csr",
    "-CA",
    "ca.crt",
    "-CAkey",
    "ca.key",
    "-CAcreateserial",
    "-out",
    "client.crt",
    "-days",
    "2",
    "-extfile",
    "client.ext",
  ]);
  await openssl(dir, ["ec", "-in", "client.pkcs8.key", "-out", "client.sec1.key"]);
  await openssl(dir, ["genrsa", "-traditional", "-out", "rsa.pkcs1.key", "2048"]);
  await openssl(dir, [
    "req",
    "-new",
    "-key",
    "rsa.pkcs1.key",
    "-out",
    "rsa.csr",
    "-subj",
    "/O=system:node-proxier/CN=system:kube-proxy-rsa",
  ]);
  await openssl(dir, [
    "x509",
    "-req",
    "-in",
    "rsa.csr",
    "-CA",
    "ca.crt",
    "-CAkey",
    "ca.key",
    "-CAcreateserial",
    "-out",
    "rsa.crt",
    "-days",
    "2",
    "-extfile",
    "client.ext",
  ]);
  const paths = {
    caCert: `${dir}/ca.crt`,
    serverCert: `${dir}/server.crt`,
    serverKey: `${dir}/server.key`,
    clientCert: `${dir}/client.crt`,
    clientKeyPkcs8: `${dir}/client.pkcs8.key`,
    clientKeySec1: `${dir}/client.sec1.key`,
    rsaClientCert: `${dir}/rsa.crt`,
    rsaClientKeyPkcs1: `${dir}/rsa.pkcs1.key`,
  };
  const read = (p: string) => Deno.readTextFile(p);
  return {
    dir,
    caCert: await read(paths.caCert),
    caKey: await read(`${dir}/ca.key`),
    serverCert: await read(paths.serverCert),
    serverKey: await read(paths.serverKey),
    clientCert: await read(paths.clientCert),
    clientKeyPkcs8: await read(paths.clientKeyPkcs8),
    clientKeySec1: await read(paths.clientKeySec1),
    rsaClientCert: await read(paths.rsaClientCert),
    rsaClientKeyPkcs1: await read(paths.rsaClientKeyPkcs1),
    paths,
  };
}

const EC_P256 = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256"];

/** A self-signed EC P-256 CA written as `<dir>/<name>.crt` and `<dir>/<name>.key`; returns their paths. */
export async function makeCA(
  dir: string,
  name = "ca",
  cn = "test-ca",
): Promise<{ cert: string; key: string }> {
  await openssl(dir, [
    "req",
    "-x509",
    ...EC_P256,
    "-nodes",
    "-keyout",
    `${name}.key`,
    "-out",
    `${name}.crt`,
    "-days",
    "2",
    "-subj",
    `/CN=${cn}`,
  ]);
  return { cert: `${dir}/${name}.crt`, key: `${dir}/${name}.key` };
}

/** What {@linkcode issueCert} puts in a certificate. */
export interface CertRequest {
  /** File base name: `<dir>/<name>.crt` and `<dir>/<name>.key` (EC P-256, PKCS#8). */
  name: string;
  /** Common name (a Kubernetes user name for client certificates). */
  cn: string;
  /** Organizations (Kubernetes groups for client certificates). */
  orgs?: string[];
  /** Server certificate with these subjectAltNames (`IP:...`, `DNS:...`); a client certificate otherwise. */
  serverSANs?: string[];
}

/** Issues a certificate signed by `ca` (from {@linkcode makeCA}, same dir); returns the paths. */
export async function issueCert(
  dir: string,
  ca: { cert: string; key: string },
  req: CertRequest,
): Promise<{ cert: string; key: string }> {
  const subject = [...(req.orgs ?? []).map((o) => `/O=${o}`), `/CN=${req.cn}`].join("");
  const ext = req.serverSANs
    ? `subjectAltName=${req.serverSANs.join(",")}\nextendedKeyUsage=serverAuth\n`
    : "extendedKeyUsage=clientAuth\n";
  await Deno.writeTextFile(`${dir}/${req.name}.ext`, ext);
  await openssl(dir, [
    "req",
    ...EC_P256,
    "-nodes",
    "-keyout",
    `${req.name}.key`,
    "-out",
    `${req.name}.csr`,
    "-subj",
    subject,
  ]);
  await openssl(dir, [
    "x509",
    "-req",
    "-in",
    `${req.name}.csr`,
    "-CA",
    ca.cert,
    "-CAkey",
    ca.key,
    "-CAcreateserial",
    "-out",
    `${req.name}.crt`,
    "-days",
    "2",
    "-extfile",
    `${req.name}.ext`,
  ]);
  return { cert: `${dir}/${req.name}.crt`, key: `${dir}/${req.name}.key` };
}

/** An EC P-256 key pair (PKCS#8 private key, SubjectPublicKeyInfo public key) as `<dir>/<name>.key/.pub`. */
export async function makeKeyPair(dir: string, name: string): Promise<{ key: string; pub: string }> {
  await openssl(dir, [
    "genpkey",
    "-algorithm",
    "EC",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-out",
    `${name}.key`,
  ]);
  await openssl(dir, ["pkey", "-in", `${name}.key`, "-pubout", "-out", `${name}.pub`]);
  return { key: `${dir}/${name}.key`, pub: `${dir}/${name}.pub` };
}

/**
 * Issues another server certificate from the PKI's CA, for the given subjectAltName list (e.g.
 * `DNS:elsewhere.example`); returns its PEM certificate and key. Used to test name-mismatch failures.
 */
export async function issueServerCert(pki: TestPki, san: string): Promise<{ cert: string; key: string }> {
  const name = `server-${crypto.randomUUID().slice(0, 8)}`;
  const dir = pki.dir;
  await Deno.writeTextFile(`${dir}/${name}.ext`, `subjectAltName=${san}\nextendedKeyUsage=serverAuth\n`);
  await openssl(dir, [
    "req",
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
    "-keyout",
    `${name}.key`,
    "-out",
    `${name}.csr`,
    "-subj",
    "/CN=kube-apiserver",
  ]);
  await openssl(dir, [
    "x509",
    "-req",
    "-in",
    `${name}.csr`,
    "-CA",
    "ca.crt",
    "-CAkey",
    "ca.key",
    "-CAcreateserial",
    "-out",
    `${name}.crt`,
    "-days",
    "2",
    "-extfile",
    `${name}.ext`,
  ]);
  return {
    cert: await Deno.readTextFile(`${dir}/${name}.crt`),
    key: await Deno.readTextFile(`${dir}/${name}.key`),
  };
}
