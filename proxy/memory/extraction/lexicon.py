"""Word lists the rules extractor consults; lower case throughout."""

from __future__ import annotations

from proxy.terms import STOP_WORDS


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


ENTITY_TYPES = _words("person organization place product pet preference identifier event")

MONTHS_AND_DAYS = _words(
    """january february march april may june july august september october november december
    jan feb mar apr jun jul aug sep sept oct nov dec monday tuesday wednesday thursday friday
    saturday sunday mon tue tues wed thu thurs fri sat sun weekend today tonight tomorrow yesterday"""
)

# Capitalised only because they open a sentence or a greeting; never a name on their own.
STARTERS = STOP_WORDS | _words(
    """the a an i my our your his her their its this that these those there here what when where
    why how who which whose yes no yeah yep nope ok okay sure thanks thank please sorry hi hello
    hey dear congrats congratulations wow oh ah um well so and but or also then now just still
    actually honestly basically anyway anyways maybe perhaps probably definitely really quite
    last next first second finally recently lately today yesterday tomorrow tonight morning
    evening afternoon good great nice cool awesome lol omg btw fyi note remember let lets can
    could would should will shall might must may do does did is are was were be been have has had
    please kindly every each some any all many most few several both either neither another
    other such only even ever never always usually often sometimes since after before during
    while until unless if though although because as at in on by for from to with without about
    into onto over under between through around near per via re hmm haha happy merry dearest
    call tell ask give show find make help write send check use try get set run add remove update
    fix explain summarize summarise describe list compare translate meeting"""
)

DEMONYMS = _words(
    """english french spanish german italian chinese japanese korean thai indian american
    canadian british mexican brazilian russian dutch swedish norwegian danish finnish portuguese
    polish irish scottish welsh australian european asian african arabic hindi vietnamese greek
    turkish persian hebrew filipino indonesian ukrainian swiss austrian belgian latin christian
    muslim jewish buddhist hindu catholic christmas easter thanksgiving halloween ramadan
    hanukkah diwali internet god"""
)

ORG_SUFFIXES = _words(
    """inc inc. ltd ltd. llc llp plc corp corp. corporation co co. company gmbh ag sa bv labs lab
    traders trading pharma pharmaceuticals university college institute school academy hospital
    clinic bank foundation group holdings systems technologies technology tech solutions partners
    capital ventures studios studio media airlines airways motors enterprises industries
    associates consulting agency society association council ministry department shelter church
    union club analytics software networks robotics dynamics logistics insurance energy foods
    games security digital biotech therapeutics"""
)

# A name continues across "of" only after one of these: "University of Toronto", "Bank of America".
OF_HEADS = _words(
    """university college institute school academy bank museum department ministry city republic
    kingdom isle gulf bay lake cape port statue church house tower palace state states province
    county district duke queen king prince princess"""
)

ORG_HEADS = _words("university college institute school academy hospital bank ministry department")

PLACE_SUFFIXES = _words(
    """park tower street st avenue ave road rd boulevard blvd bridge lake river mountain mountains
    beach island islands airport station square museum mall valley bay city county state province
    cafe café restaurant bar hotel market gardens garden zoo stadium arena heights village town
    canyon falls forest harbor harbour hill hills coast"""
)

EVENT_HEADS = _words(
    """group class classes meeting conference concert festival workshop party event parade camp
    retreat session course seminar meetup game show wedding ceremony service rally talk lecture
    exhibition fair match race marathon tournament recital gala fundraiser"""
)

TECH = _words(
    """python java javascript typescript rust golang ruby kotlin scala haskell elixir erlang clojure
    php perl lua julia dart zig vim neovim emacs vscode intellij pycharm xcode docker kubernetes
    k8s terraform ansible helm git github gitlab bitbucket jenkins postgres postgresql mysql sqlite
    mongodb redis kafka rabbitmq elasticsearch nginx linux ubuntu debian fedora centos macos windows
    ios android aws gcp azure heroku vercel netlify cloudflare slack discord zoom notion obsidian
    jira confluence trello asana figma excel react vue angular svelte django flask fastapi rails
    nodejs node deno npm pnpm yarn pip poetry conda pytest numpy pandas pytorch tensorflow chatgpt
    copilot chrome firefox safari spotify iphone ipad macbook kindle photoshop gmail outlook
    dropbox grafana prometheus datadog sentry airflow snowflake bigquery supabase firebase
    openai anthropic google microsoft apple amazon meta facebook netflix nvidia ibm"""
)
TECH_ORGS = _words("openai anthropic google microsoft apple amazon meta facebook netflix nvidia ibm")

MOTION_VERBS = _words(
    """went go goes going moved move moving travel travelled traveled travelling traveling flew fly
    flying drove drive driving relocated relocating headed heading trip back returned return
    visiting visited visit vacation holiday"""
)
FROM_CUES = _words(
    """am is are was were come comes came originally moved move moving flew drove relocated
    immigrated emigrated visiting hail hails back"""
)
PLACE_PREPOSITIONS = _words("in at near around across inside outside throughout")
PRODUCT_VERBS = _words(
    """use uses used using install installed installing run runs running switched switch migrated
    migrate deploy deployed deploying adopted adopt tried try trying"""
)

# Verbs after a sentence-initial word that make it a person: "Sam said", "Priya texted".
SUBJECT_CUES = _words(
    """said says told tells asked asks thinks thought wants wanted called texted emailed mentioned
    lives works loves likes hates"""
)
