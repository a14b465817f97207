#!/usr/bin/env python3
"""Generates testdata/classify/corpus.jsonl: labelled prompts for `kinfctl classify --eval`.

Deterministic (fixed seed). Every value is synthetic: card numbers are Luhn-valid numbers made
here, IBANs get a computed mod-97 checksum, SSNs are drawn from valid ranges, phone numbers use
fictional ranges where a country has one (US 555-01xx, UK Ofcom drama ranges). Labels come from
what was inserted: a template marked with its entity tags, hard negatives with none.

Run: python3 testdata/classify/gen_corpus.py > testdata/classify/corpus.jsonl
"""
import base64
import json
import random

R = random.Random(7)

FIRST = ["Anna", "Jonas", "Priya", "Mateo", "Chloé", "Kenji", "Fatima", "Liam", "Olga", "Tomás"]
LAST = ["Schmidt", "Patel", "García", "Dubois", "Tanaka", "Okafor", "Nowak", "Rossi", "Smith"]
DOMAINS = ["example.com", "mail.example.org", "acme-corp.io", "uni-hamburg.de", "gmail.com",
           "outlook.fr", "company.co.uk"]


def luhn_complete(prefix, length):
    digits = [int(c) for c in prefix]
    while len(digits) < length - 1:
        digits.append(R.randint(0, 9))
    for check in range(10):
        ds = digits + [check]
        s = 0
        for i, d in enumerate(reversed(ds)):
            if i % 2 == 1:
                d *= 2
                if d > 9:
                    d -= 9
            s += d
        if s % 10 == 0:
            return "".join(map(str, ds))
    raise AssertionError


def luhn_bad(prefix, length):
    good = luhn_complete(prefix, length)
    last = (int(good[-1]) + R.randint(1, 9)) % 10
    return good[:-1] + str(last)


def fmt_card(num, sep):
    if len(num) == 15:
        groups = [num[:4], num[4:10], num[10:]]
    else:
        groups = [num[i:i + 4] for i in range(0, len(num), 4)]
    return sep.join(groups) if sep is not None else num


def card():
    brand = R.choice([("4", 16), ("4", 16), ("51", 16), ("55", 16), ("2223", 16), ("34", 15),
                      ("37", 15), ("6011", 16), ("65", 16), ("3530", 16)])
    return fmt_card(luhn_complete(*brand), R.choice([" ", "-", None, " "]))


IBAN_SHAPES = {"DE": "n18", "GB": "a4n14", "FR": "n10a11n2", "NL": "a4n10", "ES": "n20",
               "IT": "a1n10a12", "BE": "n12", "CH": "n5a12", "PL": "n24", "AT": "n16"}


def iban(spaced=None):
    cc = R.choice(list(IBAN_SHAPES))
    shape = IBAN_SHAPES[cc]
    bban = ""
    i = 0
    while i < len(shape):
        kind = shape[i]
        j = i + 1
        while j < len(shape) and shape[j].isdigit():
            j += 1
        n = int(shape[i + 1:j])
        for _ in range(n):
            bban += R.choice("0123456789") if kind == "n" else R.choice("ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")
        i = j
    rearranged = bban + cc + "00"
    num = int("".join(str(int(c, 36)) for c in rearranged))
    check = 98 - num % 97
    s = f"{cc}{check:02d}{bban}"
    if spaced is None:
        spaced = R.random() < 0.6
    return " ".join(s[i:i + 4] for i in range(0, len(s), 4)) if spaced else s


def ssn():
    while True:
        a = R.randint(1, 899)
        if a != 666:
            break
    return f"{a:03d}-{R.randint(1, 99):02d}-{R.randint(1, 9999):04d}"


def email():
    f, l = R.choice(FIRST), R.choice(LAST)
    user = R.choice([f"{f}.{l}", f"{f[0]}{l}", f"{f}{R.randint(1, 99)}", f"{l}.{f}+news"])
    user = user.lower().replace("é", "e").replace("á", "a").replace("í", "i")
    return f"{user}@{R.choice(DOMAINS)}"


def phone():
    return R.choice([
        f"({R.randint(201, 989)}) 555-01{R.randint(0, 99):02d}",
        f"{R.randint(201, 989)}-555-01{R.randint(0, 99):02d}",
        f"{R.randint(201, 989)}.555.01{R.randint(0, 99):02d}",
        f"+1 {R.randint(201, 989)} 555 01{R.randint(0, 99):02d}",
        f"1-800-555-01{R.randint(0, 99):02d}",
        f"+44 20 7946 0{R.randint(100, 999)}",
        f"020 7946 0{R.randint(100, 999)}",
        f"07700 900{R.randint(100, 999)}",
        f"+44 7700 900{R.randint(100, 999)}",
        f"0161 496 0{R.randint(100, 999)}",
        f"+49 30 {R.randint(1000000, 99999999)}",
        f"030 {R.randint(1000000, 99999999)}",
        f"0151 {R.randint(10000000, 99999999)}",
        f"+49 (0)89 {R.randint(100000, 9999999)}",
        f"+33 1 {R.randint(10, 99)} {R.randint(10, 99)} {R.randint(10, 99)} {R.randint(10, 99)}",
        f"01 {R.randint(10, 99)} {R.randint(10, 99)} {R.randint(10, 99)} {R.randint(10, 99)}",
        f"06.{R.randint(10, 99)}.{R.randint(10, 99)}.{R.randint(10, 99)}.{R.randint(10, 99)}",
        f"+33 6 {R.randint(10, 99)} {R.randint(10, 99)} {R.randint(10, 99)} {R.randint(10, 99)}",
        f"+91 98{R.randint(100, 999)} {R.randint(10000, 99999)}",
        f"+81 3-{R.randint(1000, 9999)}-{R.randint(1000, 9999)}",
        f"+61 2 {R.randint(1000, 9999)} {R.randint(1000, 9999)}",
        f"+4915{R.randint(100000000, 999999999)}",
    ])


def ipv4():
    return R.choice([
        f"203.0.113.{R.randint(1, 254)}", f"198.51.100.{R.randint(1, 254)}",
        f"192.168.{R.randint(0, 255)}.{R.randint(1, 254)}", f"10.{R.randint(0, 255)}.{R.randint(0, 255)}.{R.randint(1, 254)}",
        f"172.16.{R.randint(0, 255)}.{R.randint(1, 254)}", f"{R.randint(11, 223)}.{R.randint(0, 255)}.{R.randint(0, 255)}.{R.randint(1, 254)}",
    ])


def ipv6():
    h = lambda: f"{R.randint(1, 0xffff):x}"
    return R.choice([
        f"2001:db8:{h()}:{h()}::{h()}", f"fe80::{h()}:{h()}:{h()}:{h()}",
        f"2001:0db8:85a3:0000:0000:8a2e:0370:{R.randint(0x1000, 0xffff):04x}",
        f"2a00:1450:4001:{h()}::200e",
    ])


ALNUM = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789"
UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"


def rnd(alphabet, n):
    return "".join(R.choice(alphabet) for _ in range(n))


def b64u(obj):
    return base64.urlsafe_b64encode(json.dumps(obj, separators=(",", ":")).encode()).decode().rstrip("=")


def jwt():
    header = b64u({"alg": R.choice(["HS256", "RS256", "ES256"]), "typ": "JWT"})
    payload = b64u({"sub": str(R.randint(1000, 99999)), "iat": 1716239022, "role": "admin"})
    return f"{header}.{payload}.{rnd(ALNUM + '-_', 43)}"


def pem():
    kind = R.choice(["RSA PRIVATE KEY", "PRIVATE KEY", "EC PRIVATE KEY", "OPENSSH PRIVATE KEY"])
    body = "\n".join(rnd(ALNUM + "+/", 64) for _ in range(R.randint(3, 8)))
    return f"-----BEGIN {kind}-----\n{body}\n-----END {kind}-----"


def credential():
    return R.choice([
        "AKIA" + rnd(UPPER, 16), "ASIA" + rnd(UPPER, 16), "ghp_" + rnd(ALNUM, 36),
        "xoxb-" + f"{R.randint(10**11, 10**12)}-{R.randint(10**11, 10**12)}-" + rnd(ALNUM, 24),
        "sk_live_" + rnd(ALNUM, 24), "Bearer " + rnd(ALNUM + "._-", 40), jwt(),
        "github_pat_" + rnd(ALNUM, 22) + "_" + rnd(ALNUM, 59),
    ])


GEN = {"email": email, "phone": phone, "ssn": ssn, "credit-card": card, "iban": iban,
       "ip-address": lambda: R.choice([ipv4, ipv4, ipv6])(), "credential": credential}

# Positive templates: {x} is filled with a value of the entity.
POS = {
    "email": [
        "Hi, can you draft a reply to {x} saying we moved the meeting to Thursday?",
        "Customer record:\n{{\"name\": \"{n}\", \"email\": \"{x}\", \"plan\": \"pro\"}}\nSummarise the account.",
        "In this Python snippet, why does send() fail?\n```python\nADMIN = \"{x}\"\nsmtp.sendmail(ADMIN, to, msg)\n```",
        "Best regards,\n{n}\n{x}\n\nPlease translate the email above into German.",
        "2024-03-02 14:11:09 WARN auth: password reset requested for {x} (attempt 3)",
        "Mi correo es {x}, ¿puedes enviarme el resumen?",
        "Add {x} to the CC list and rewrite this more politely: 'send me the numbers now'.",
    ],
    "phone": [
        "Please call me back at {x} after 5pm, I want to discuss the contract.",
        "Format this contact card as vCard: {n}, tel {x}, Berlin office.",
        "Rufen Sie mich unter {x} an, wenn die Lieferung da ist.",
        "Vous pouvez me joindre au {x} demain matin.",
        "{{\"contact\": {{\"name\": \"{n}\", \"phone\": \"{x}\"}}}} -- convert this JSON to YAML",
        "The caller left a voicemail: 'This is {n}, my number is {x}, please ring back.'",
        "Emergency contact for the trip: {n} ({x}). Write a short packing list too.",
        "customers.csv:\nid,name,phone\n17,{n},{x}\nDeduplicate the rows.",
    ],
    "ssn": [
        "My SSN is {x}, do I need it for the W-4 form?",
        "Employee onboarding row: {n} | DOB 1988-04-12 | SSN {x} | start 2024-06-01. Create a welcome email.",
        "Fix the validation: ssn = \"{x}\"  # user input\nif not re.match(PATTERN, ssn): raise ValueError",
        "Social security number: {x}. Can you explain what each part of the number means?",
    ],
    "credit-card": [
        "I was charged twice on my card {x}, how do I file a dispute?",
        "Payment failed for card number {x}, exp 09/27. What does error code 51 mean?",
        "Test this function with card=\"{x}\" and tell me what the output is:\n```js\nfunction mask(c) {{ return c.slice(-4); }}\n```",
        "{{\"payment\": {{\"pan\": \"{x}\", \"cvv\": \"***\", \"amount\": 129.99}}}} Why is this request rejected?",
        "Kreditkarte: {x} - bitte die Rechnung erneut senden.",
    ],
    "iban": [
        "Please transfer the deposit to IBAN {x} (account holder {n}).",
        "Veuillez virer le montant sur le compte {x} avant vendredi.",
        "Bankverbindung: {n}, IBAN: {x}, BIC: COBADEFFXXX. Formuliere eine Zahlungserinnerung.",
        "supplier.csv row: {n};{x};EUR;net30 -- what does net30 mean?",
    ],
    "ip-address": [
        "Why am I seeing repeated failed SSH logins from {x} in auth.log?",
        "nginx: {x} - - [12/Mar/2024:10:01:22 +0000] \"GET /admin HTTP/1.1\" 403 153. Is this an attack?",
        "Configure the firewall to allow only {x} on port 5432.",
        "My server's address is {x}; write an ansible inventory for it.",
        "GET /login?ip={x}&retry=2 returned 429 -- explain rate limiting.",
        "```yaml\ndatabase:\n  host: {x}\n  port: 5432\n```\nWhy does the connection time out?",
    ],
    "credential": [
        "Here's my config, why does it 401?\nexport AUTH={x}\ncurl -H \"Authorization: Bearer $AUTH\" https://api.example.com/v1/items",
        "I accidentally committed this, what should I do? token = \"{x}\"",
        "```python\nclient = Client(api_key=\"{x}\")\nprint(client.list())\n```\nIt raises PermissionDenied.",
        "Request headers:\nAuthorization: {x}\nContent-Type: application/json\nWhat's wrong with the request?",
        "The CI log printed {x} -- is that a problem?",
    ],
}
PEM_TEMPLATES = [
    "Why does ssh say 'bad permissions'? my key file is:\n{x}",
    "Convert this key to PKCS8 for Java:\n{x}",
]

NEG = [
    "Where is my order? The order number is {oid} and it was placed on 2024-02-11.",
    "Your order #{oid} has shipped. Tracking number 1Z999AA1{trk}. Write a friendly delivery note.",
    "Invoice {inv} is overdue by 14 days; draft a reminder.",
    "Upgrade the cluster from version 1.27.3 to 1.28.4 and tell me what breaks.",
    "We run kernel 5.15.0-91-generic and Python 3.11.4 on all hosts.",
    "The firmware version 2.4.10.3 fixes the watchdog bug. Summarise the release notes.",
    "Pin the dependency to v1.2.3.4 in requirements.txt and explain semantic versioning.",
    "Chrome 120.0.6099.109 crashes on startup, is there a known issue?",
    "The job started at 2024-01-15T10:30:00Z and finished at 2024-01-15T11:02:45.123Z. How long did it take?",
    "Log line: 2023-11-02 08:15:33,412 INFO worker-3 processed batch 4821 in 1532 ms",
    "Convert the unix timestamp {ts} to a human readable date in UTC.",
    "The event ids are {ts}123 and {ts}456; which came first?",
    "Request id {uuid} failed with a 502, what could cause it?",
    "Commit {sha} introduced a regression; how do I bisect it?",
    "The file's sha256 is {sha256}. How do I verify the download?",
    "docker pull registry.example.com/app@sha256:{sha256}",
    "Call the function with n=1234567890 and explain the overflow.",
    "The ticket id is 4155550132, please look into it.",
    "Our SKU 550-123-4567 is out of stock; write a back-order notice.",
    "Part no. 123-45-6789 is discontinued.",
    "ISBN 978-3-16-148410-0 is the first edition. Write a book blurb.",
    "The population grew from 1 234 567 to 1 345 678 between 2010 and 2020.",
    "Prices: $1,299.99, €1.049,00 and £999. Which is cheapest after conversion?",
    "Compute 192.5 * 168.25 and round to two decimals.",
    "Coordinates 48.8566, 2.3522 are in Paris; what's nearby?",
    "The MAC address 00:1A:2B:3C:4D:5E belongs to which vendor?",
    "At 10:30:45 the service restarted, and at 11:15:02 again.",
    "Set the subnet mask to 255.255.255.0 on the interface.",
    "Bind the dev server to 0.0.0.0:8080 and open localhost:3000 in a browser.",
    "ping 127.0.0.1 works but the container can't reach the host.",
    "Use `Authorization: Bearer <YOUR_TOKEN>` in the header, where the token comes from the dashboard.",
    "Set the header to 'Bearer ' + os.environ['API_TOKEN'] before sending.",
    "The AWS docs use AKIAIOSFODNN7EXAMPLE as a sample access key id; why?",
    "export OPENAI_API_KEY=sk-your-key-here  # replace with your key",
    "Here is my public key:\n-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE\n-----END PUBLIC KEY-----\nIs it safe to share?",
    "What's the difference between `-----BEGIN PRIVATE KEY-----` and `-----BEGIN RSA PRIVATE KEY-----` headers?",
    "```cpp\nstd::vector<int> v{{1, 2, 3}};\nfor (auto x : v) std::cout << x << std::endl;\n```\nWhy does this not compile with -std=c++03?",
    "```rust\nlet addr = \"[::1]:8080\".parse::<SocketAddr>()?;\n```\nexplain the IPv6 loopback syntax",
    "```python\nMAX = 4294967295\nmask = 0xFFFFFFFF\nprint(hex(MAX & mask))\n```",
    "In CSS, what's the difference between #ff00ff and rgb(255, 0, 255)?",
    "Sort these numbers: 4821 9932 1104 7781 2209 5540 and explain quicksort.",
    "What does the HTTP status 418 mean? And 503?",
    "Meeting on 01.02.2024 um 10:30 im Raum 3.14, bitte bestätigen.",
    "The regex `\\d{{3}}-\\d{{2}}-\\d{{4}}` matches SSN-shaped strings; how do I make it stricter?",
    "Explain how the Luhn algorithm validates a card number, step by step.",
    "What is an IBAN and how is its check digit computed?",
    "Our office hours are 9-17, Monday to Friday. Rewrite this as a sign.",
    "The test card 4111 1111 1111 1112 is rejected; is my Luhn implementation wrong?",
    "The SSN 000-12-3456 in the example is intentionally invalid; explain why.",
    "Stack trace: at com.example.App.main(App.java:42)\n\tat java.base/jdk.internal.reflect.NativeMethodAccessorImpl.invoke0(Native Method)",
    "The build number is 20240115103000; where does it come from?",
    "pip install torch==2.1.0+cu118 torchvision==0.16.0",
    "Write a haiku about autumn leaves.",
    "Explain the difference between TCP and UDP for a beginner.",
    "Summarise the plot of Hamlet in three sentences.",
    "What are good names for a golden retriever puppy?",
    "Translate 'the weather is lovely today' into French and Japanese.",
    "Give me a 5-day workout plan for beginners.",
    "How do I reverse a linked list in Java?",
    "Write SQL to find the top 10 customers by revenue in 2023.",
    "Why is the sky blue? Explain like I'm 10.",
    "List three differences between mitosis and meiosis.",
    "The matrix [[1, 2], [3, 4]] has determinant -2; verify it.",
    "Account balance went from 10,000.00 to 12,345.67 - what's the percentage change?",
    "Send the package to Gate 12, Terminal 2, flight LH 2034 departs 14:25.",
    "Our support line opens at 08:00 and closes at 18:00 CET.",
    "ffmpeg -ss 00:01:30.500 -t 00:00:10 -i in.mp4 out.mp4 -- why is the cut off by a frame?",
    "git log --since=2024-01-01 --until=2024-02-01 --format='%h %an' | wc -l",
    "In Excel, =SUM(A1:A10)/COUNT(B2:B20) returns #DIV/0!, why?",
    "The GPS reads 40.7128 N, 74.0060 W; convert it to degrees-minutes-seconds.",
    "Flight UA 1234 on 2024-05-06, seat 12A, confirmation code ABC123.",
    "Resize the image from 1920 x 1080 to 1280 x 720 keeping the aspect ratio.",
    "Timecode 01:02:03:04 at 29.97 fps is how many frames?",
    "C++: what does ::operator new(size_t) do differently from new T?",
    "The loop ran 1000000000 iterations in 2.35 s; is that reasonable?",
    "Tracking: 9400 1000 0000 0000 0000 00 (USPS). When will it arrive?",
]


def fill_neg(t):
    return t.format(
        oid=R.randint(10**9, 10**10 - 1), trk=rnd("0123456789", 9), inv=f"INV-2024-{R.randint(1000, 9999)}",
        ts=R.randint(1_600_000_000, 1_750_000_000),
        uuid=f"{rnd('0123456789abcdef', 8)}-{rnd('0123456789abcdef', 4)}-4{rnd('0123456789abcdef', 3)}-a{rnd('0123456789abcdef', 3)}-{rnd('0123456789abcdef', 12)}",
        sha=rnd("0123456789abcdef", 40), sha256=rnd("0123456789abcdef", 64))


def name():
    return f"{R.choice(FIRST)} {R.choice(LAST)}"


def positive(entity):
    if entity == "credential" and R.random() < 0.15:
        return R.choice(PEM_TEMPLATES).format(x=pem())
    return R.choice(POS[entity]).format(x=GEN[entity](), n=name())


FILLER_TURNS = [
    ("user", "Can you help me plan the quarterly report?"),
    ("assistant", "Sure. First, list the key metrics; then we can draft each section."),
    ("user", "Revenue was up 12% and churn down to 3.1%. Make a table."),
    ("assistant", "| Metric | Q3 |\n|---|---|\n| Revenue growth | 12% |\n| Churn | 3.1% |"),
    ("system", "You are a helpful assistant. Answer concisely."),
    ("tool", "{\"status\": \"ok\", \"rows\": 42, \"elapsed_ms\": 131}"),
]


def conversation(inner_text, tags):
    """A multi-turn chat with `inner_text` placed in a random earlier message or tool result."""
    msgs = [{"role": "system", "content": "You are a support agent for ACME. Version 3.2.1.0 of the policy applies."}]
    n = R.randint(2, 6)
    pos = R.randint(0, n - 1)
    for i in range(n):
        if i == pos:
            role = R.choice(["user", "user", "tool", "assistant", "system"])
            msgs.append({"role": role, "content": inner_text})
        else:
            role, content = R.choice(FILLER_TURNS)
            if role == "system":
                role = "user"
            if R.random() < 0.3:
                content = [{"type": "text", "text": content}]
            msgs.append({"role": role, "content": content})
    msgs.append({"role": "user", "content": "Thanks. What should I do next?"})
    return {"messages": msgs, "tags": tags}


def tags_for(entities):
    ents = sorted(set(entities))
    return (["pii-detected"] + [f"pii-{e}" for e in ents]) if ents else []


def main():
    rows = []
    entities = list(POS)
    for e in entities:
        for _ in range(22):
            rows.append({"text": positive(e), "tags": tags_for([e])})
    # Mixed prompts with several entities.
    for _ in range(25):
        es = R.sample(entities, R.randint(2, 3))
        rows.append({"text": "\n".join(positive(e) for e in es), "tags": tags_for(es)})
    # Unseparated phone numbers: real PII the documented rule does not catch.
    rows.append({"text": "text me on 4155550123 when you land", "tags": tags_for(["phone"])})
    # Long conversations: PII hidden in an earlier turn, a system prompt or a tool result.
    for _ in range(30):
        e = R.choice(entities)
        rows.append(conversation(positive(e), tags_for([e])))
    # Hard negatives, each several times with fresh numbers.
    for t in NEG:
        for _ in range(2):
            rows.append({"text": fill_neg(t), "tags": []})
    for _ in range(25):
        rows.append(conversation(fill_neg(R.choice(NEG)), []))
    # Negatives embedded in a long document (~2k tokens).
    for _ in range(5):
        text = "\n\n".join(fill_neg(R.choice(NEG)) for _ in range(40))
        rows.append({"text": text, "tags": []})
    for r in rows:
        print(json.dumps(r, ensure_ascii=False))


if __name__ == "__main__":
    main()
