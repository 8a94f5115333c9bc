"""JUnit XML parsing, including refusal of unsafe XML."""

import pytest

from termgym.verifiers import ReportParseError, parse_junit

# pytest --junitxml=/logs/verifier/results.xml (pytest 8, junit_family=xunit2).
PYTEST_JUNITXML = """<?xml version="1.0" encoding="utf-8"?><testsuites><testsuite name="pytest" errors="1" \
failures="1" skipped="1" tests="5" time="0.412" timestamp="2024-06-10T12:00:00.123456+00:00" hostname="a1b2c3">\
<testcase classname="tests.test_outputs" name="test_server_listens" time="0.101" />\
<testcase classname="tests.test_outputs" name="test_response_body" time="0.052"><failure message="AssertionError: \
assert b'Hello' == b'Hello, world'">def test_response_body():
        body = urlopen("http://localhost:8080").read()
&gt;       assert body == b"Hello, world"
E       AssertionError: assert b'Hello' == b'Hello, world'

/tests/test_outputs.py:18: AssertionError</failure></testcase>\
<testcase classname="tests.test_outputs" name="test_db_schema" time="0.000"><error message="failed on setup with \
&quot;sqlite3.OperationalError: unable to open database file&quot;">@pytest.fixture
    def db():
&gt;       return sqlite3.connect("/app/data/app.db")
E       sqlite3.OperationalError: unable to open database file</error></testcase>\
<testcase classname="tests.test_outputs" name="test_tls" time="0.000"><skipped type="pytest.skip" \
message="no certificate configured">/tests/test_outputs.py:40: no certificate configured</skipped></testcase>\
<testcase classname="tests.test_outputs" name="test_headers[content-type]" time="0.003"><system-out>GET / 200\
</system-out></testcase></testsuite></testsuites>"""

# PHPUnit --log-junit: suites nested three deep under the root <testsuites>.
PHPUNIT_NESTED = """<?xml version="1.0" encoding="UTF-8"?>
<testsuites>
  <testsuite name="" tests="4" assertions="6" errors="0" failures="1" skipped="1" time="0.021">
    <testsuite name="Unit" tests="4" assertions="6" errors="0" failures="1" skipped="1" time="0.021">
      <testsuite name="Tests\\Unit\\CartTest" file="/app/tests/Unit/CartTest.php" tests="3">
        <testcase name="testAddsItem" class="Tests\\Unit\\CartTest" classname="Tests.Unit.CartTest"
                  file="/app/tests/Unit/CartTest.php" line="12" assertions="2" time="0.004"/>
        <testcase name="testTotal" class="Tests\\Unit\\CartTest" classname="Tests.Unit.CartTest"
                  file="/app/tests/Unit/CartTest.php" line="20" assertions="1" time="0.006">
          <failure type="PHPUnit\\Framework\\ExpectationFailedException">Tests\\Unit\\CartTest::testTotal
Failed asserting that 9.5 matches expected 10.0.

/app/tests/Unit/CartTest.php:24</failure>
        </testcase>
        <testsuite name="Tests\\Unit\\CartTest::testDiscount" tests="1">
          <testcase name="testDiscount with data set #0" classname="Tests.Unit.CartTest" assertions="1" time="0.001"/>
        </testsuite>
      </testsuite>
      <testsuite name="Tests\\Unit\\PaymentTest" file="/app/tests/Unit/PaymentTest.php" tests="1">
        <testcase name="testRefund" classname="Tests.Unit.PaymentTest" assertions="0" time="0.000">
          <skipped/>
        </testcase>
      </testsuite>
    </testsuite>
  </testsuite>
</testsuites>
"""

# Maven Surefire TEST-*.xml: a single <testsuite> root; a rerun-flaky test passed in the end.
SUREFIRE = """<?xml version="1.0" encoding="UTF-8"?>
<testsuite xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance" \
xsi:noNamespaceSchemaLocation="https://maven.apache.org/surefire/maven-surefire-plugin/xsd/surefire-test-report-3.0.xsd" \
version="3.0" name="com.example.CalculatorTest" time="0.052" tests="5" errors="1" skipped="1" failures="1">
  <properties>
    <property name="java.version" value="17.0.9"/>
  </properties>
  <testcase name="addsNumbers" classname="com.example.CalculatorTest" time="0.003"/>
  <testcase name="dividesByZero" classname="com.example.CalculatorTest" time="0.011">
    <error message="/ by zero" type="java.lang.ArithmeticException"><![CDATA[java.lang.ArithmeticException: / by zero
\tat com.example.Calculator.divide(Calculator.java:12)]]></error>
  </testcase>
  <testcase name="subtracts" classname="com.example.CalculatorTest" time="0.001">
    <failure message="expected: &lt;2&gt; but was: &lt;3&gt;" type="org.opentest4j.AssertionFailedError"/>
  </testcase>
  <testcase name="multiplies" classname="com.example.CalculatorTest" time="0">
    <skipped message="not implemented yet"/>
  </testcase>
  <testcase name="retriesConnection" classname="com.example.CalculatorTest" time="0.2">
    <flakyFailure message="timeout" type="java.net.SocketTimeoutException"/>
  </testcase>
</testsuite>
"""

BILLION_LAUGHS = """<?xml version="1.0"?>
<!DOCTYPE lolz [
 <!ENTITY lol "lol">
 <!ENTITY lol1 "&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;&lol;">
 <!ENTITY lol2 "&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;&lol1;">
 <!ENTITY lol3 "&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;&lol2;">
 <!ENTITY lol4 "&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;&lol3;">
 <!ENTITY lol5 "&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;&lol4;">
 <!ENTITY lol6 "&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;&lol5;">
 <!ENTITY lol7 "&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;&lol6;">
 <!ENTITY lol8 "&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;&lol7;">
 <!ENTITY lol9 "&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;&lol8;">
]>
<testsuites><testsuite><testcase name="&lol9;"/></testsuite></testsuites>
"""

EXTERNAL_ENTITY = """<?xml version="1.0"?>
<!DOCTYPE testsuites [<!ENTITY xxe SYSTEM "file:///etc/passwd">]>
<testsuites><testsuite><testcase name="t"><failure message="&xxe;"/></testcase></testsuite></testsuites>
"""


def test_pytest_junitxml():
    report = parse_junit([PYTEST_JUNITXML])
    assert report.format == "junit" and report.binary is False
    assert [(a.name, a.status) for a in report.assertions] == [
        ("tests.test_outputs::test_server_listens", "passed"),
        ("tests.test_outputs::test_response_body", "failed"),
        ("tests.test_outputs::test_db_schema", "failed"),
        ("tests.test_outputs::test_tls", "skipped"),
        ("tests.test_outputs::test_headers[content-type]", "passed"),
    ]
    assert report.assertions[1].message == "AssertionError: assert b'Hello' == b'Hello, world'"
    assert report.assertions[2].message.startswith('failed on setup with "sqlite3.OperationalError')
    assert report.assertions[3].message == "no certificate configured"


def test_nested_suites_phpunit():
    report = parse_junit([PHPUNIT_NESTED])
    assert [(a.name, a.status) for a in report.assertions] == [
        ("Tests.Unit.CartTest::testAddsItem", "passed"),
        ("Tests.Unit.CartTest::testTotal", "failed"),
        ("Tests.Unit.CartTest::testDiscount with data set #0", "passed"),
        ("Tests.Unit.PaymentTest::testRefund", "skipped"),
    ]
    # no message attribute: the element text is the message
    assert report.assertions[1].message.startswith("Tests\\Unit\\CartTest::testTotal\nFailed asserting")


def test_surefire_single_testsuite_root():
    report = parse_junit([SUREFIRE])
    assert [(a.name, a.status, a.message) for a in report.assertions] == [
        ("com.example.CalculatorTest::addsNumbers", "passed", ""),
        ("com.example.CalculatorTest::dividesByZero", "failed", "/ by zero"),
        ("com.example.CalculatorTest::subtracts", "failed", "expected: <2> but was: <3>"),
        ("com.example.CalculatorTest::multiplies", "skipped", "not implemented yet"),
        ("com.example.CalculatorTest::retriesConnection", "passed", ""),  # flaky, passed on rerun
    ]


def test_documents_aggregated_in_given_order():
    report = parse_junit([SUREFIRE, PYTEST_JUNITXML])
    assert len(report.assertions) == 10
    assert report.assertions[0].name == "com.example.CalculatorTest::addsNumbers"
    assert report.assertions[5].name == "tests.test_outputs::test_server_listens"
    reverse = parse_junit([PYTEST_JUNITXML, SUREFIRE])
    assert reverse.assertions[0].name == "tests.test_outputs::test_server_listens"


@pytest.mark.parametrize(
    ("xml", "name"),
    [
        ('<testsuite><testcase name="plain"/></testsuite>', "plain"),
        ('<testsuite><testcase classname="" name="empty-class"/></testsuite>', "empty-class"),
        ('<testsuite><testcase classname="C" name="n"/></testsuite>', "C::n"),
    ],
)
def test_name_with_and_without_classname(xml, name):
    assert parse_junit([xml]).assertions[0].name == name


def test_failure_wins_over_skipped_and_error_is_failed():
    xml = '<testsuites><testcase name="a"><skipped/><failure message="f"/></testcase><testcase name="b"><error>boom</error></testcase></testsuites>'
    report = parse_junit([xml])
    assert [(a.status, a.message) for a in report.assertions] == [("failed", "f"), ("failed", "boom")]


def test_bytes_document_honours_declared_encoding():
    xml = '<?xml version="1.0" encoding="ISO-8859-1"?><testsuite><testcase name="caf\xe9"/></testsuite>'
    assert parse_junit([xml.encode("latin-1")]).assertions[0].name == "caf\xe9"


def test_empty_suite_is_valid():
    assert parse_junit(["<testsuites/>"]).assertions == ()


@pytest.mark.parametrize(
    "texts",
    [
        [BILLION_LAUGHS],
        [EXTERNAL_ENTITY],
        ['<!DOCTYPE testsuites SYSTEM "http://example.com/junit.dtd"><testsuites/>'],
        ["<!DOCTYPE testsuites><testsuites/>"],
        [PYTEST_JUNITXML[:200]],  # truncated
        ["not xml at all"],
        [""],
        ["<html><body>500</body></html>"],  # wrong root
        ['<testcase name="t"/>'],  # a bare testcase is not a report
        ["<testsuites/>", "<testsuites>"],  # one bad document spoils the lot
        [],
        [None],
    ],
)
def test_garbage_and_unsafe_xml_raise_report_parse_error(texts):
    with pytest.raises(ReportParseError):
        parse_junit(texts)


def test_billion_laughs_error_mentions_refusal():
    with pytest.raises(ReportParseError, match="unsafe XML"):
        parse_junit([BILLION_LAUGHS])
